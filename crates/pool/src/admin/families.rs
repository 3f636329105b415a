//! Merging metric families that repeat on one page: the exposition format allows each family
//! once, with all its samples together, and a page put together from several registries (the
//! gateway's pools) or from one registry holding the same families twice (two TLS ports'
//! series, told apart by a `port` label) has some twice.

use std::collections::HashMap;

/// Metric families gathered from one or several encoded registries.
#[derive(Default)]
pub(super) struct Families {
    /// Name, metadata lines (`# HELP`, `# TYPE`, `# UNIT`) and sample lines of each family, in
    /// order of first appearance.
    families: Vec<(String, String, String)>,
    index: HashMap<String, usize>,
}

impl Families {
    /// Adds the families of one encoded registry. A family seen before keeps its first metadata
    /// and gains these samples.
    pub(super) fn add(&mut self, text: &str) {
        let mut current: Option<usize> = None;
        let mut keep_meta = false;
        for line in text.lines() {
            if line.is_empty() || line == "# EOF" {
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                // `# HELP name …`, `# TYPE name …`, `# UNIT name …`
                let name = meta.split(' ').nth(1).unwrap_or_default();
                // A new block: another family's metadata, or a `# HELP` (each block's first
                // line), also of the family just read when its block comes twice in a row.
                if meta.starts_with("HELP ") || current.is_none_or(|i| self.families[i].0 != name) {
                    let i = match self.index.get(name) {
                        Some(&i) => {
                            keep_meta = false;
                            i
                        }
                        None => {
                            keep_meta = true;
                            self.families
                                .push((name.to_owned(), String::new(), String::new()));
                            self.index.insert(name.to_owned(), self.families.len() - 1);
                            self.families.len() - 1
                        }
                    };
                    current = Some(i);
                }
                if keep_meta && let Some(i) = current {
                    self.families[i].1.push_str(line);
                    self.families[i].1.push('\n');
                }
            } else {
                let i = match current {
                    Some(i) => i,
                    None => {
                        // Samples before any metadata (not produced by the encoder): keep them.
                        self.families
                            .push((String::new(), String::new(), String::new()));
                        let i = self.families.len() - 1;
                        current = Some(i);
                        i
                    }
                };
                self.families[i].2.push_str(line);
                self.families[i].2.push('\n');
            }
        }
    }

    pub(super) fn into_text(self) -> String {
        let len = self
            .families
            .iter()
            .map(|(_, m, s)| m.len() + s.len())
            .sum::<usize>();
        let mut out = String::with_capacity(len + 8);
        for (_, meta, samples) in self.families {
            out.push_str(&meta);
            out.push_str(&samples);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Families;

    #[test]
    fn families_from_several_registries_are_merged_once_each_in_first_order() {
        let mut f = Families::default();
        f.add(
            "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\"} 1\n\
             # HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"m\"} 2\n",
        );
        f.add(
            "# HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"n\"} 3\n\
             # HELP a_total A.\n# TYPE a_total counter\na_total{model=\"n\"} 4\n\
             # HELP c C.\n# TYPE c gauge\nc 5\n# EOF\n",
        );
        assert_eq!(
            f.into_text(),
            "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\"} 1\n\
             a_total{model=\"n\"} 4\n\
             # HELP b B.\n# TYPE b gauge\n# UNIT b seconds\nb{model=\"m\"} 2\nb{model=\"n\"} 3\n\
             # HELP c C.\n# TYPE c gauge\nc 5\n"
        );
    }

    /// One registry holding the same families twice (the ext_proc port's TLS series and the
    /// metrics port's, the latter labelled `port`): one block per family on the page.
    #[test]
    fn a_family_registered_twice_in_one_registry_comes_out_once() {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        let mut registry = prometheus_client::registry::Registry::default();
        let front: Family<Vec<(String, String)>, Counter> = Family::default();
        front
            .get_or_create(&vec![("reason".into(), "error".into())])
            .inc();
        registry.register("tls_failures", "Failed handshakes", front);
        let admin: Family<Vec<(String, String)>, Counter> = Family::default();
        admin
            .get_or_create(&vec![("reason".into(), "error".into())])
            .inc_by(2);
        registry
            .sub_registry_with_label(("port".into(), "admin".into()))
            .register("tls_failures", "Failed handshakes", admin);
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
        assert_eq!(
            page.matches("# TYPE tls_failures counter").count(),
            2,
            "{page}"
        );
        let merged = crate::admin::merge_families(&page);
        assert_eq!(
            merged,
            "# HELP tls_failures Failed handshakes.\n# TYPE tls_failures counter\n\
             tls_failures_total{reason=\"error\"} 1\n\
             tls_failures_total{port=\"admin\",reason=\"error\"} 2\n# EOF\n"
        );
    }
}
