//! Static discovery: endpoints listed in a YAML file.
//!
//! ```yaml
//! engine: vllm                 # default engine for entries without one (else --default-engine)
//! namespace: default           # default namespace
//! endpoints:
//!   - address: 10.0.0.7:8000
//!     name: llama-a            # optional; defaults to the address
//!     engine: sglang           # optional; the engine-type label also works
//!     gpu: H100                # optional
//!     labels: { zone: a }      # optional
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use infergate_metrics::{ENGINE_LABEL, Error as MetricsError, engine_for};
use infergate_pool::precise::check_port_labels;
use infergate_scheduler::EndpointMeta;
use serde::Deserialize;

use crate::error::Error;
use crate::run::invalid_in;

/// The endpoints file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointsFile {
    /// Engine for entries that name none (and carry no engine-type label).
    #[serde(default)]
    pub engine: Option<String>,
    /// Namespace for entries that name none.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The endpoints.
    #[serde(default)]
    pub endpoints: Vec<EndpointEntry>,
}

/// One endpoint in the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointEntry {
    /// `ip:port` requests and scrapes go to.
    pub address: String,
    /// A name for logs and metrics.
    #[serde(default)]
    pub name: Option<String>,
    /// Namespace (or group).
    #[serde(default)]
    pub namespace: Option<String>,
    /// `vllm`, `sglang` or `tgi`.
    #[serde(default)]
    pub engine: Option<String>,
    /// GPU type, informational.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl EndpointsFile {
    /// Reads and parses an endpoints file; `default_engine` (the picker's `--default-engine`)
    /// is the engine of entries for which neither the entry nor the file names one.
    pub fn load(path: &Path, default_engine: Option<&str>) -> Result<Vec<EndpointMeta>, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: EndpointsFile =
            serde_yaml::from_str(&text).map_err(|source| match shape_hint(&text) {
                Some(hint) => invalid_in(path, hint.to_owned()),
                None => Error::Yaml {
                    path: path.to_owned(),
                    source,
                },
            })?;
        let endpoints = file.endpoints(default_engine)?;
        if endpoints.is_empty() {
            // Static discovery never changes: a picker started on no endpoint answers every
            // request 503 and is never ready.
            return Err(invalid_in(
                path,
                "lists no endpoint, so every request would be answered 503 `no_endpoints`: \
                 list the pool's endpoints under `endpoints:` (`- address: 10.0.0.7:8000`)"
                    .to_owned(),
            ));
        }
        Ok(endpoints)
    }

    /// The endpoints, validated: addresses parse, no address twice, every engine known. An
    /// entry's engine is its own `engine` (or engine-type label), else the file's `engine`, else
    /// `default_engine`.
    pub fn endpoints(&self, default_engine: Option<&str>) -> Result<Vec<EndpointMeta>, Error> {
        let mut out: Vec<EndpointMeta> = Vec::with_capacity(self.endpoints.len());
        for e in &self.endpoints {
            let addr: SocketAddr = e.address.trim().parse().map_err(|_| Error::Endpoint {
                endpoint: e.address.clone(),
                reason: "`address` must be ip:port",
            })?;
            if out.iter().any(|o| o.addr == addr) {
                return Err(Error::Endpoint {
                    endpoint: e.address.clone(),
                    reason: "listed twice",
                });
            }
            let mut labels = e.labels.clone();
            if let Some(engine) = &e.engine {
                labels.insert(ENGINE_LABEL.to_owned(), engine.clone());
            }
            // Read only when precise prefix routing is on, and then a bad value is only a
            // warning (a pod label may be anything); in a file, refuse it with the file.
            if let Err(reason) = check_port_labels(&labels) {
                return Err(Error::Endpoint {
                    endpoint: e.address.clone(),
                    reason,
                });
            }
            let fallback = self.engine.as_deref().or(default_engine);
            let engine = match engine_for(&e.address, &labels, fallback) {
                Err(MetricsError::MissingEngine { .. }) => {
                    return Err(Error::Endpoint {
                        endpoint: e.address.clone(),
                        reason: "has no engine: set its `engine` (or the label \
                                 inference.networking.k8s.io/engine-type), the file's `engine`, \
                                 or the picker's --default-engine",
                    });
                }
                other => other?,
            };
            out.push(EndpointMeta {
                namespace: e
                    .namespace
                    .clone()
                    .or_else(|| self.namespace.clone())
                    .unwrap_or_else(|| String::from("default")),
                pod: e.name.clone().unwrap_or_else(|| addr.to_string()),
                addr,
                engine,
                gpu: e.gpu.clone(),
                labels,
            });
        }
        Ok(out)
    }
}

/// What to say of a file that did not parse because it is laid out as the flag's one-line help
/// suggests rather than as the format is: a bare list of entries, or entries that are bare
/// addresses. `None` for any other mistake, whose parser error says it best.
fn shape_hint(text: &str) -> Option<&'static str> {
    let entries = match serde_yaml::from_str::<serde_yaml::Value>(text).ok()? {
        serde_yaml::Value::Sequence(_) => {
            return Some(
                "the file is a bare list: put the entries under an `endpoints:` key \
                 (`endpoints:` then `  - address: 10.0.0.7:8000`), beside the optional \
                 `engine:` and `namespace:`",
            );
        }
        serde_yaml::Value::Mapping(m) => m.get("endpoints")?.as_sequence()?.clone(),
        _ => return None,
    };
    entries.iter().any(serde_yaml::Value::is_string).then_some(
        "each entry under `endpoints:` is a map: write `- address: 10.0.0.7:8000`, not \
         `- 10.0.0.7:8000`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use infergate_scheduler::EngineType;

    fn parse(text: &str) -> Result<Vec<EndpointMeta>, Error> {
        parse_with(text, None)
    }

    fn parse_with(text: &str, default_engine: Option<&str>) -> Result<Vec<EndpointMeta>, Error> {
        serde_yaml::from_str::<EndpointsFile>(text)
            .unwrap()
            .endpoints(default_engine)
    }

    #[test]
    fn reads_engines_names_and_defaults() {
        let eps = parse(
            "engine: vllm\nendpoints:\n  - address: 127.0.0.1:8000\n  - address: 127.0.0.1:8001\n    name: b\n    engine: sglang\n    gpu: A10G\n",
        )
        .unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0].engine, EngineType::Vllm);
        assert_eq!(eps[0].pod, "127.0.0.1:8000");
        assert_eq!(eps[0].namespace, "default");
        assert_eq!(eps[1].engine, EngineType::Sglang);
        assert_eq!(eps[1].pod, "b");
        assert_eq!(eps[1].gpu.as_deref(), Some("A10G"));
    }

    #[test]
    fn rejects_bad_addresses_duplicates_and_missing_engines() {
        let bad = parse("engine: vllm\nendpoints:\n  - address: nope\n").unwrap_err();
        assert!(bad.to_string().contains("ip:port"), "{bad}");
        let dup =
            parse("engine: vllm\nendpoints:\n  - address: 127.0.0.1:1\n  - address: 127.0.0.1:1\n")
                .unwrap_err();
        assert!(dup.to_string().contains("twice"), "{dup}");
        let none = parse("endpoints:\n  - address: 127.0.0.1:1\n").unwrap_err();
        let msg = none.to_string();
        assert!(
            msg.contains("endpoint `127.0.0.1:1`: has no engine"),
            "{msg}"
        );
        assert!(msg.contains("--default-engine"), "{msg}");
        // An engine named but unknown is the scraper's error, naming the value.
        let bad = parse("endpoints:\n  - {address: 127.0.0.1:1, engine: vlm}\n").unwrap_err();
        assert!(matches!(bad, Error::Engine(_)), "{bad}");
        let cause = std::error::Error::source(&bad).unwrap().to_string();
        assert!(cause.contains("\"vlm\""), "{cause}");
    }

    /// A KV-event port label that is not a port is refused with the file, naming the entry and
    /// the label: read at the pick, it was a warning, and the pod followed the configured port,
    /// which on a host of several engines is another engine's feed.
    #[test]
    fn kv_event_port_labels_must_be_ports() {
        let entry = |label: &str, value: &str| {
            format!(
                "engine: vllm\nendpoints:\n  - address: 127.0.0.1:1\n    labels: {{ {label}: \"{value}\" }}\n"
            )
        };
        for label in [
            infergate_pool::precise::EVENTS_PORT_LABEL,
            infergate_pool::precise::REPLAY_PORT_LABEL,
        ] {
            for value in ["60o2", "0", "65536", ""] {
                let err = parse(&entry(label, value)).unwrap_err().to_string();
                assert!(err.starts_with("endpoint `127.0.0.1:1`: "), "{err}");
                assert!(err.contains(label) && err.contains("1 to 65535"), "{err}");
            }
            let eps = parse(&entry(label, "6002")).unwrap();
            assert_eq!(eps[0].labels[label], "6002");
        }
    }

    /// A file that lists no endpoint (empty, or `endpoints: []`) is refused: static discovery
    /// never changes, and such a picker started, was never ready and answered every request
    /// 503. A bare list, or bare addresses as entries, say how the file is laid out (they said
    /// `invalid type: sequence, expected struct EndpointsFile`).
    #[test]
    fn an_empty_or_misshapen_file_says_what_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            let path = dir.path().join("endpoints.yaml");
            std::fs::write(&path, text).unwrap();
            let err = EndpointsFile::load(&path, Some("vllm")).unwrap_err();
            assert!(matches!(err, Error::Yaml { .. }), "{text:?}: {err}");
            assert!(err.to_string().contains("endpoints.yaml"), "{err}");
            infergate_pool::ErrorChain(&err).to_string()
        };
        for empty in ["", "\n", "engine: vllm\n", "endpoints: []\n"] {
            let chain = load(empty);
            assert!(chain.contains("lists no endpoint"), "{empty:?}: {chain}");
        }
        let chain = load("- address: 127.0.0.1:8000\n  engine: vllm\n");
        assert!(
            chain.contains("put the entries under an `endpoints:` key"),
            "{chain}"
        );
        let chain = load("endpoints:\n  - 127.0.0.1:8000\n");
        assert!(
            chain.contains("write `- address: 10.0.0.7:8000`"),
            "{chain}"
        );
        // Other mistakes keep the parser's own words.
        let chain = load("endpoint:\n  - address: 127.0.0.1:8000\n");
        assert!(chain.contains("unknown field `endpoint`"), "{chain}");
        let path = dir.path().join("good.yaml");
        std::fs::write(&path, "endpoints:\n  - address: 127.0.0.1:8000\n").unwrap();
        assert_eq!(EndpointsFile::load(&path, Some("vllm")).unwrap().len(), 1);
    }

    /// `--default-engine` applies to entries for which neither the entry nor the file names an
    /// engine (it was ignored, and such an entry refused); the entry, then the file, win over it.
    #[test]
    fn the_pickers_default_engine_is_the_last_resort() {
        let text =
            "endpoints:\n  - address: 127.0.0.1:1\n  - {address: 127.0.0.1:2, engine: tgi}\n";
        let eps = parse_with(text, Some("sglang")).unwrap();
        assert_eq!(eps[0].engine, EngineType::Sglang);
        assert_eq!(eps[1].engine, EngineType::Tgi);
        let eps = parse_with(&format!("engine: vllm\n{text}"), Some("sglang")).unwrap();
        assert_eq!(eps[0].engine, EngineType::Vllm);
        assert_eq!(eps[1].engine, EngineType::Tgi);
    }
}
