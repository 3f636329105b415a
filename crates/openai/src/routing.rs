//! The body-based router's model table.
//!
//! Maps the `model` a client sends — a served base model or one of its LoRA adapters — to the
//! target that serves it (a pool, an HTTPRoute header value, a set of endpoints: the caller's `T`)
//! and to the base model name. The ext_proc body-based router and the standalone gateway both
//! resolve through this one table, so they agree on every name.

use std::collections::HashMap;

use crate::error::ApiError;

/// How many served names an "unknown model" error lists before it shortens the list.
const KNOWN_NAMES_IN_ERRORS: usize = 16;

/// A model name that cannot be added to the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelRouterError {
    /// The name is already taken by another model or adapter.
    #[error("model name `{name}` is configured twice (as {first} and as {second})")]
    Duplicate {
        /// The repeated name.
        name: String,
        /// What it was first.
        first: String,
        /// What it was again.
        second: String,
    },
    /// The name is empty or only whitespace.
    #[error("model and adapter names must not be empty")]
    Empty,
}

#[derive(Debug, Clone)]
struct Route {
    target: usize,
    base: usize,
    adapter: bool,
}

/// A resolved request model.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved<'r, T> {
    /// Where requests for this model go.
    pub target: &'r T,
    /// The base model that serves it (equal to the requested name unless it is an adapter).
    pub base_model: &'r str,
    /// The LoRA adapter, when the requested name is one.
    pub adapter: Option<&'r str>,
}

/// Served model names and LoRA adapters → target and base model.
#[derive(Debug, Clone)]
pub struct ModelRouter<T> {
    routes: HashMap<String, Route>,
    bases: Vec<String>,
    targets: Vec<T>,
    known: String,
}

impl<T> Default for ModelRouter<T> {
    fn default() -> Self {
        ModelRouter {
            routes: HashMap::new(),
            bases: Vec::new(),
            targets: Vec::new(),
            known: String::new(),
        }
    }
}

impl<T> ModelRouter<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a base model served by `target`, with the LoRA adapters it serves.
    pub fn add_model(
        &mut self,
        name: &str,
        adapters: &[String],
        target: T,
    ) -> Result<(), ModelRouterError> {
        let describe = |r: &Route, bases: &[String]| {
            if r.adapter {
                format!("an adapter of `{}`", bases[r.base])
            } else {
                "a model".to_owned()
            }
        };
        for n in std::iter::once(name).chain(adapters.iter().map(String::as_str)) {
            if n.trim().is_empty() {
                return Err(ModelRouterError::Empty);
            }
            if let Some(r) = self.routes.get(n) {
                let second = if n == name {
                    "a model".to_owned()
                } else {
                    format!("an adapter of `{name}`")
                };
                return Err(ModelRouterError::Duplicate {
                    name: n.to_owned(),
                    first: describe(r, &self.bases),
                    second,
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        for a in adapters {
            let first = if a == name {
                "a model".to_owned()
            } else if !seen.insert(a.as_str()) {
                format!("an adapter of `{name}`")
            } else {
                continue;
            };
            return Err(ModelRouterError::Duplicate {
                name: a.clone(),
                first,
                second: format!("an adapter of `{name}`"),
            });
        }
        let target_ix = self.targets.len();
        let base_ix = self.bases.len();
        self.targets.push(target);
        self.bases.push(name.to_owned());
        self.routes.insert(
            name.to_owned(),
            Route {
                target: target_ix,
                base: base_ix,
                adapter: false,
            },
        );
        for a in adapters {
            self.routes.insert(
                a.clone(),
                Route {
                    target: target_ix,
                    base: base_ix,
                    adapter: true,
                },
            );
        }
        self.known = render_known(self.routes.keys().map(String::as_str).collect());
        Ok(())
    }

    /// [`ModelRouter::resolve`] for a caller who may use only some names: an unknown name's
    /// error lists only the served names `visible` accepts (called with each name and its base
    /// model), so that the caller is not told of models it may not call. The list is built for
    /// each such error; a caller who may use every name takes [`ModelRouter::resolve`] and its
    /// list built once.
    pub fn resolve_visible(
        &self,
        model: &str,
        visible: impl Fn(&str, &str) -> bool,
    ) -> Result<Resolved<'_, T>, ApiError> {
        self.lookup(model)
            .ok_or_else(|| self.unknown_to(model, visible))
    }

    /// The [`ApiError::UnknownModel`] for `model`, listing only the served names `visible`
    /// accepts (called with each name and its base model): for a name that is not served, or
    /// that this caller may not be shown.
    pub fn unknown_to(&self, model: &str, visible: impl Fn(&str, &str) -> bool) -> ApiError {
        let names: Vec<&str> = self
            .routes
            .iter()
            .filter(|(n, r)| visible(n, &self.bases[r.base]))
            .map(|(n, _)| n.as_str())
            .collect();
        let known = if names.is_empty() {
            "none that this caller may use".to_owned()
        } else {
            render_known(names)
        };
        ApiError::UnknownModel {
            model: model.to_owned(),
            known,
            retrieve: false,
        }
    }

    /// Resolves a request's `model`. An unknown name is [`ApiError::UnknownModel`] (404), whose
    /// message tells the client to set the `model` field to a served model, and lists every one
    /// (see [`ModelRouter::resolve_visible`] for a caller who may use only some).
    pub fn resolve(&self, model: &str) -> Result<Resolved<'_, T>, ApiError> {
        self.lookup(model).ok_or_else(|| ApiError::UnknownModel {
            model: model.to_owned(),
            known: self.known.clone(),
            retrieve: false,
        })
    }

    fn lookup(&self, model: &str) -> Option<Resolved<'_, T>> {
        let (name, route) = self.routes.get_key_value(model)?;
        Some(Resolved {
            target: &self.targets[route.target],
            base_model: &self.bases[route.base],
            adapter: route.adapter.then_some(name.as_str()),
        })
    }

    /// Every served name (base models and adapters) with its base model, sorted by name — what
    /// `GET /v1/models` lists.
    pub fn models(&self) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = self
            .routes
            .iter()
            .map(|(n, r)| (n.as_str(), self.bases[r.base].as_str()))
            .collect();
        v.sort_unstable();
        v
    }

    /// The targets, in the order their models were added.
    pub fn targets(&self) -> &[T] {
        &self.targets
    }

    /// Whether no model is configured.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }
}

/// `names` sorted and joined for an "unknown model" error, shortened after
/// [`KNOWN_NAMES_IN_ERRORS`].
fn render_known(mut names: Vec<&str>) -> String {
    names.sort_unstable();
    let more = names.len().saturating_sub(KNOWN_NAMES_IN_ERRORS);
    let mut s = names
        .into_iter()
        .take(KNOWN_NAMES_IN_ERRORS)
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> ModelRouter<&'static str> {
        let mut r = ModelRouter::new();
        r.add_model("llama", &["sql-lora".into(), "chat-lora".into()], "pool-a")
            .unwrap();
        r.add_model("qwen", &[], "pool-b").unwrap();
        r
    }

    #[test]
    fn resolves_models_and_adapters() {
        let r = router();
        let x = r.resolve("llama").unwrap();
        assert_eq!(
            (*x.target, x.base_model, x.adapter),
            ("pool-a", "llama", None)
        );
        let x = r.resolve("sql-lora").unwrap();
        assert_eq!(
            (*x.target, x.base_model, x.adapter),
            ("pool-a", "llama", Some("sql-lora"))
        );
        assert_eq!(*r.resolve("qwen").unwrap().target, "pool-b");
        assert_eq!(
            r.models(),
            vec![
                ("chat-lora", "llama"),
                ("llama", "llama"),
                ("qwen", "qwen"),
                ("sql-lora", "llama")
            ]
        );
    }

    #[test]
    fn unknown_model_is_a_404_listing_served_models() {
        let err = router().resolve("gpt-4").unwrap_err();
        assert_eq!(err.status(), 404);
        let msg = err.to_string();
        assert!(
            msg.contains("gpt-4") && msg.contains("llama, qwen"),
            "{msg}"
        );
    }

    #[test]
    fn duplicates_and_empty_names_are_rejected() {
        let mut r = router();
        assert!(matches!(
            r.add_model("qwen", &[], "x"),
            Err(ModelRouterError::Duplicate { .. })
        ));
        let err = r
            .add_model("mistral", &["sql-lora".into()], "x")
            .unwrap_err();
        assert!(err.to_string().contains("adapter of `llama`"), "{err}");
        assert_eq!(r.add_model(" ", &[], "x"), Err(ModelRouterError::Empty));
        let err = r
            .add_model("m2", &["a".into(), "a".into()], "x")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "model name `a` is configured twice (as an adapter of `m2` and as an adapter of `m2`)"
        );
        // A model listed as its own adapter: the message says which two uses clash.
        let err = r.add_model("m3", &["m3".into()], "x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "model name `m3` is configured twice (as a model and as an adapter of `m3`)"
        );
        // A failed add leaves the table unchanged.
        assert!(r.resolve("mistral").is_err());
        assert_eq!(r.targets().len(), 2);
    }

    #[test]
    fn an_unknown_model_lists_only_what_the_caller_may_use() {
        let r = router();
        // A caller allowed `llama` (and so its adapters), not `qwen`.
        let only_llama = |_: &str, base: &str| base == "llama";
        let msg = r
            .resolve_visible("gpt-4", only_llama)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("(chat-lora, llama, sql-lora)"), "{msg}");
        assert!(!msg.contains("qwen"), "{msg}");
        let msg = r
            .resolve_visible("gpt-4", |_, _| false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("(none that this caller may use)"), "{msg}");
        // A served name resolves whatever the filter says (permission is checked apart, 403).
        assert_eq!(
            *r.resolve_visible("qwen", only_llama).unwrap().target,
            "pool-b"
        );
        // Every name visible: the same list as `resolve`.
        assert_eq!(
            r.resolve_visible("gpt-4", |_, _| true)
                .unwrap_err()
                .to_string(),
            r.resolve("gpt-4").unwrap_err().to_string()
        );
    }

    #[test]
    fn long_name_lists_are_shortened() {
        let mut r = ModelRouter::new();
        for i in 0..20 {
            r.add_model(&format!("m{i:02}"), &[], i).unwrap();
        }
        let msg = r.resolve("x").unwrap_err().to_string();
        assert!(msg.contains("and 4 more"), "{msg}");
    }
}
