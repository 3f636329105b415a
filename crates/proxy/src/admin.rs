//! What the gateway's admin port exports on `/metrics`.
//!
//! The port itself (`/metrics`, `/healthz`, `/livez`, `/readyz`) is the admin server every
//! infergate process shares, [`infergate_pool::admin::serve_with`], started by the server module
//! with [`encode_metrics`] and the configuration's readiness. What is particular to the gateway
//! is that `/metrics` is put together at each scrape from the gateway's own registry *and* the
//! registry of every model pool in the configuration in force. A fixed registry would only ever
//! show the pools that existed at start; this way a pool started by a reload is exported from
//! its first scrape, and a removed one disappears. `/heartbeat` is rendered the same way, over
//! the models in force ([`encode_heartbeat`]).

use std::collections::HashMap;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;

use crate::proxy::Shared;

/// The gateway's series followed by each current pool's, then the end marker.
///
/// Every pool registers the same metric families (told apart by their `model` label), and the
/// exposition format allows each family once, with all its samples together: the registries are
/// encoded one by one and their families merged by name, in order of first appearance.
pub(crate) fn encode_metrics(
    registry: &Registry,
    shared: &Shared,
) -> Result<String, std::fmt::Error> {
    let mut merged = Families::default();
    let mut text = String::new();
    encode_registry(&mut text, registry)?;
    merged.add(&text);
    let state = shared.state.load();
    for model in state.router.targets() {
        text.clear();
        encode_registry(&mut text, &model.backend.registry)?;
        merged.add(&text);
    }
    if let Some(registry) = state.quotas.as_ref().and_then(|q| q.registry()) {
        text.clear();
        encode_registry(&mut text, registry)?;
        merged.add(&text);
    }
    let mut out = merged.into_text();
    encode_eof(&mut out)?;
    Ok(out)
}

/// The heartbeat document (`/heartbeat`, `infergate_pool::heartbeat`): one entry per model of
/// the configuration in force.
pub(crate) fn encode_heartbeat(
    heartbeats: &infergate_pool::heartbeat::Heartbeats,
    shared: &Shared,
) -> String {
    let state = shared.state.load();
    heartbeats.render(state.router.targets().iter().map(|model| {
        let queued = model.flow.as_ref().map_or(0, |f| f.queued());
        (&*model.name, &model.backend.pool, queued)
    }))
}

/// Metric families gathered from several encoded registries.
#[derive(Default)]
struct Families {
    /// Name, metadata lines (`# HELP`, `# TYPE`, `# UNIT`) and sample lines of each family, in
    /// order of first appearance.
    families: Vec<(String, String, String)>,
    index: HashMap<String, usize>,
}

impl Families {
    /// Adds the families of one encoded registry. A family seen before keeps its first metadata
    /// and gains these samples.
    fn add(&mut self, text: &str) {
        let mut current: Option<usize> = None;
        let mut keep_meta = false;
        for line in text.lines() {
            if line.is_empty() || line == "# EOF" {
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                // `# HELP name …`, `# TYPE name …`, `# UNIT name …`
                let name = meta.split(' ').nth(1).unwrap_or_default();
                if current.is_none_or(|i| self.families[i].0 != name) {
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

    fn into_text(self) -> String {
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
}
