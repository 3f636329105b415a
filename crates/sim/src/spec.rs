//! Fleet descriptions: which pods, on which profile, speaking which engine's metrics, with which
//! LoRA adapters and faults. Read from YAML (`infergate sim --fleet fleet.yaml`) or built in code.
//!
//! ```yaml
//! seed: 7
//! pods:
//!   - name: h100            # with replicas > 1 the pods are h100-0, h100-1, ...
//!     profile: llama-3.1-8b/h100
//!     engine: vllm          # vllm | sglang | tgi
//!     replicas: 2
//!     lora_adapters: [sql-lora, chat-lora]
//!     max_loras: 2
//!     faults:               # live serving; the discrete-event fleet runs error_rate and slowdown
//!       - { at_s: 30, hang: true }
//!       - { at_s: 60, hang: false, metrics: frozen, error_rate: 0.1, slowdown: 2.0 }
//! ```

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Catalog, Profile, SimError};

/// Which model server a pod imitates: decides the `/metrics` names and format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM (`vllm:` families, as vLLM 0.32 serves them).
    #[default]
    Vllm,
    /// SGLang (`sglang:` families).
    Sglang,
    /// Text Generation Inference (`tgi_` families; no KV gauge).
    Tgi,
}

impl EngineKind {
    /// Lower-case name, as in the `inference.networking.k8s.io/engine-type` pod label.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Tgi => "tgi",
        }
    }
}

/// What the `/metrics` endpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsFault {
    /// Live values.
    #[default]
    Normal,
    /// The page stops changing (the last page served is repeated).
    Frozen,
    /// `/metrics` answers 404.
    Missing,
    /// `/metrics` accepts the request and answers nothing until the fault clears; inference
    /// is served as usual (a server whose event loop is too busy to render its page).
    Stall,
}

/// A pod's fault state. Every field is optional in a fleet file's fault step: unset fields keep
/// their previous value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// The pod accepts connections but never answers any endpoint.
    pub hang: bool,
    /// `/metrics` behaviour.
    pub metrics: MetricsFault,
    /// Fraction (0–1) of inference requests answered with HTTP 500.
    pub error_rate: f64,
    /// Step-time multiplier (1 = profile speed).
    pub slowdown: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            hang: false,
            metrics: MetricsFault::Normal,
            error_rate: 0.0,
            slowdown: 1.0,
        }
    }
}

impl Faults {
    /// The faults a pod starts with and the rest of its script, from a fault list in any order:
    /// the steps at 0 s are applied to the defaults, the later ones are returned in time order
    /// (steps at the same time in the order given).
    pub fn scripted(steps: &[FaultStep]) -> (Faults, Vec<FaultStep>) {
        let mut script = steps.to_vec();
        script.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let mut faults = Faults::default();
        script.retain(|s| {
            if s.at_s <= 0.0 {
                s.apply(&mut faults);
                false
            } else {
                true
            }
        });
        (faults, script)
    }
}

/// A scripted change of faults, `at_s` seconds after the fleet starts serving.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultStep {
    /// Seconds after start.
    pub at_s: f64,
    /// New `hang`, if set.
    #[serde(default)]
    pub hang: Option<bool>,
    /// New metrics behaviour, if set.
    #[serde(default)]
    pub metrics: Option<MetricsFault>,
    /// New error rate, if set.
    #[serde(default)]
    pub error_rate: Option<f64>,
    /// New slowdown, if set.
    #[serde(default)]
    pub slowdown: Option<f64>,
}

impl FaultStep {
    /// The first value the emulator cannot honour: its field (`at_s`, `error_rate`, `slowdown`)
    /// and why, or `None` when every value can be used. Shared by fleet files and benchmark
    /// scenarios, each of which names the step its own way.
    pub fn invalid_field(&self) -> Option<(&'static str, String)> {
        if !self.at_s.is_finite() || self.at_s < 0.0 {
            return Some((
                "at_s",
                format!(
                    "{} must be 0 or more (seconds after the fleet starts)",
                    self.at_s
                ),
            ));
        }
        if let Some(e) = self.error_rate
            && !(0.0..=1.0).contains(&e)
        {
            return Some(("error_rate", format!("{e} must be between 0 and 1")));
        }
        if let Some(s) = self.slowdown
            && !(s.is_finite() && s > 0.0)
        {
            return Some((
                "slowdown",
                format!("{s} must be above 0 (a step-time multiplier; 1 is the profile's speed)"),
            ));
        }
        None
    }

    /// Refuses values the emulator cannot honour, naming the pod and the field.
    fn validate(&self, pod: &str) -> Result<(), SimError> {
        match self.invalid_field() {
            None => Ok(()),
            Some((field, why)) => Err(SimError::FleetInvalid(format!(
                "pod {pod}: fault {field}: {why}"
            ))),
        }
    }

    /// Applies the set fields to `f`.
    pub fn apply(&self, f: &mut Faults) {
        if let Some(v) = self.hang {
            f.hang = v;
        }
        if let Some(v) = self.metrics {
            f.metrics = v;
        }
        if let Some(v) = self.error_rate {
            f.error_rate = v.clamp(0.0, 1.0);
        }
        if let Some(v) = self.slowdown {
            f.slowdown = v;
        }
    }
}

/// One resolved pod.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Unique name (also sent in the `x-infergate-pod` response header).
    pub name: String,
    /// Its performance profile.
    pub profile: Arc<Profile>,
    /// Which engine's metrics it serves.
    pub engine: EngineKind,
    /// Served (base) model name.
    pub model: Arc<str>,
    /// LoRA adapters it can serve.
    pub lora_adapters: Vec<Arc<str>>,
    /// Resident LoRA slots.
    pub max_loras: u32,
    /// Seed for the pod's own randomness (error injection, generated text).
    pub seed: u64,
    /// Faults from the start.
    pub faults: Faults,
    /// Scripted fault changes, in time order (each `at_s` above 0: steps at 0 are in
    /// `faults`).
    pub fault_script: Vec<FaultStep>,
    /// Fixed port for live serving (0 = any free port).
    pub port: u16,
}

impl PodSpec {
    /// A fault-free pod on `profile` with the profile's model name and LoRA slots.
    pub fn new(name: impl Into<String>, profile: &Profile, engine: EngineKind) -> Self {
        PodSpec {
            name: name.into(),
            model: profile.model.as_str().into(),
            profile: Arc::new(profile.clone()),
            engine,
            lora_adapters: Vec::new(),
            max_loras: profile.max_loras,
            seed: 0,
            faults: Faults::default(),
            fault_script: Vec::new(),
            port: 0,
        }
    }
}

/// A resolved fleet.
#[derive(Debug, Clone, Default)]
pub struct FleetSpec {
    /// Base seed; pod seeds derive from it.
    pub seed: u64,
    /// The pods, in order (their index is the pod index of [`crate::fleet::Fleet`]).
    pub pods: Vec<PodSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetFile {
    #[serde(default)]
    seed: u64,
    pods: Vec<PodEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PodEntry {
    name: String,
    profile: String,
    #[serde(default)]
    engine: EngineKind,
    #[serde(default = "one")]
    replicas: u32,
    #[serde(default)]
    served_model_name: Option<String>,
    #[serde(default)]
    lora_adapters: Vec<String>,
    #[serde(default)]
    max_loras: Option<u32>,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    faults: Vec<FaultStep>,
}

fn one() -> u32 {
    1
}

impl FleetSpec {
    /// Parses a fleet file against the built-in profiles.
    pub fn from_yaml(text: &str) -> Result<Self, SimError> {
        Self::from_yaml_with(text, &Catalog::builtin()?)
    }

    /// Reads and parses a fleet file.
    pub fn from_file(path: &Path) -> Result<Self, SimError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::FleetRead {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses a fleet file against `catalog`.
    pub fn from_yaml_with(text: &str, catalog: &Catalog) -> Result<Self, SimError> {
        let file: FleetFile = serde_yaml::from_str(text).map_err(SimError::FleetYaml)?;
        let mut spec = FleetSpec {
            seed: file.seed,
            pods: Vec::new(),
        };
        for entry in file.pods {
            let profile = catalog.get(&entry.profile)?;
            if entry.replicas == 0 {
                return Err(SimError::FleetInvalid(format!(
                    "pod {} has replicas: 0",
                    entry.name
                )));
            }
            for step in &entry.faults {
                step.validate(&entry.name)?;
            }
            let (faults, script) = Faults::scripted(&entry.faults);
            for r in 0..entry.replicas {
                let name = if entry.replicas == 1 {
                    entry.name.clone()
                } else {
                    format!("{}-{r}", entry.name)
                };
                let mut pod = PodSpec::new(name, profile, entry.engine);
                if let Some(m) = &entry.served_model_name {
                    pod.model = m.as_str().into();
                }
                pod.lora_adapters = entry
                    .lora_adapters
                    .iter()
                    .map(|a| a.as_str().into())
                    .collect();
                pod.max_loras = entry.max_loras.unwrap_or(profile.max_loras);
                pod.faults = faults;
                pod.fault_script = script.clone();
                pod.port = match entry.port {
                    Some(0) | None => 0,
                    Some(p) => u16::try_from(r)
                        .ok()
                        .and_then(|r| p.checked_add(r))
                        .ok_or_else(|| {
                            SimError::FleetInvalid(format!(
                                "pod {}: port {p} with replicas: {} runs past port 65535",
                                entry.name, entry.replicas
                            ))
                        })?,
                };
                spec.pods.push(pod);
            }
        }
        spec.finish()
    }

    /// Assigns pod seeds and validates names and adapters.
    pub fn finish(mut self) -> Result<Self, SimError> {
        if self.pods.is_empty() {
            return Err(SimError::FleetInvalid(
                "a fleet needs at least one pod".into(),
            ));
        }
        let mut names: Vec<&str> = self.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(SimError::FleetInvalid(format!(
                "two pods are named {}",
                w[0]
            )));
        }
        let mut ports: Vec<(u16, &str)> = self
            .pods
            .iter()
            .filter(|p| p.port != 0)
            .map(|p| (p.port, p.name.as_str()))
            .collect();
        ports.sort_unstable();
        if let Some(w) = ports.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(SimError::FleetInvalid(format!(
                "pods {} and {} both listen on port {} (a pod with `replicas: N` takes N ports \
                 from its `port`)",
                w[0].1, w[1].1, w[0].0
            )));
        }
        for (i, pod) in self.pods.iter_mut().enumerate() {
            if !pod.lora_adapters.is_empty() && pod.max_loras == 0 {
                return Err(SimError::FleetInvalid(format!(
                    "pod {} lists LoRA adapters but has max_loras: 0",
                    pod.name
                )));
            }
            // An empty name is one no client can send, and no log or header can show.
            if pod.name.is_empty() {
                return Err(SimError::FleetInvalid(format!(
                    "pod number {} of the fleet has an empty name",
                    i + 1
                )));
            }
            if pod.model.is_empty() {
                return Err(SimError::FleetInvalid(format!(
                    "pod {} has an empty served_model_name",
                    pod.name
                )));
            }
            if pod.lora_adapters.iter().any(|a| a.is_empty()) {
                return Err(SimError::FleetInvalid(format!(
                    "pod {} lists a LoRA adapter with an empty name",
                    pod.name
                )));
            }
            // A request names an adapter by its `model`: with a name listed twice, which of
            // the two serves it would be left to the order of the list.
            for (j, adapter) in pod.lora_adapters.iter().enumerate() {
                if pod.lora_adapters[..j].contains(adapter) {
                    return Err(SimError::FleetInvalid(format!(
                        "pod {} lists LoRA adapter {adapter} twice",
                        pod.name
                    )));
                }
            }
            if pod.lora_adapters.len() > usize::from(u16::MAX) {
                return Err(SimError::FleetInvalid(format!(
                    "pod {} has too many adapters",
                    pod.name
                )));
            }
            if pod.seed == 0 {
                pod.seed = self
                    .seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add(i as u64 + 1);
            }
        }
        Ok(self)
    }

    /// A fleet of `n` identical pods named `prefix-0..n`.
    pub fn uniform(
        profile: &Profile,
        engine: EngineKind,
        prefix: &str,
        n: usize,
    ) -> Result<Self, SimError> {
        let pods = (0..n)
            .map(|i| PodSpec::new(format!("{prefix}-{i}"), profile, engine))
            .collect();
        FleetSpec { seed: 0, pods }.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_listed_twice_is_refused() {
        let pod = |adapters: &str| {
            FleetSpec::from_yaml(&format!(
                "seed: 1\npods:\n  - name: a\n    profile: llama-3.1-8b/h100\n    lora_adapters: {adapters}\n"
            ))
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert_eq!(pod("[x, y]"), Ok(()));
        let twice = pod("[x, y, x]").unwrap_err();
        assert!(
            twice.contains("pod a lists LoRA adapter x twice"),
            "{twice}"
        );
    }

    #[test]
    fn empty_names_are_refused() {
        let refused = |pod: &str| {
            FleetSpec::from_yaml(&format!(
                "seed: 1\npods:\n  - {{ name: b, profile: llama-3.1-8b/h100 }}\n  - {{ profile: llama-3.1-8b/h100, {pod} }}\n"
            ))
            .unwrap_err()
            .to_string()
        };
        for (pod, says) in [
            ("name: ''", "pod number 2 of the fleet has an empty name"),
            (
                "name: a, served_model_name: ''",
                "pod a has an empty served_model_name",
            ),
            (
                "name: a, lora_adapters: [x, '']",
                "pod a lists a LoRA adapter with an empty name",
            ),
        ] {
            let e = refused(pod);
            assert!(e.contains(says), "{pod}: {e}");
        }
    }

    #[test]
    fn fleet_file_expands_replicas_and_faults() {
        let spec = FleetSpec::from_yaml(
            "seed: 3\npods:\n  - name: a\n    profile: llama-3.1-8b/a10g\n    engine: tgi\n    replicas: 2\n    lora_adapters: [x]\n    faults:\n      - { at_s: 0, slowdown: 2 }\n      - { at_s: 5, hang: true }\n  - name: b\n    profile: llama-3.1-8b/h100\n",
        )
        .unwrap();
        assert_eq!(spec.pods.len(), 3);
        assert_eq!(spec.pods[1].name, "a-1");
        assert_eq!(spec.pods[1].engine, EngineKind::Tgi);
        assert_eq!(spec.pods[0].faults.slowdown, 2.0);
        assert_eq!(spec.pods[0].fault_script.len(), 1);
        assert_eq!(spec.pods[2].engine, EngineKind::Vllm);
        assert_ne!(spec.pods[0].seed, spec.pods[1].seed);
    }

    proptest::proptest! {
        // Seeded: a failure reproduces on every run.
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
            ..proptest::test_runner::Config::default()
        })]

        #[test]
        fn any_text_is_a_fleet_or_a_typed_error(text in "(pods|name|profile|replicas|faults|at_s|[-:{}\\[\\], \n]|[a-z0-9./]){0,200}") {
            let _ = FleetSpec::from_yaml(&text);
        }
    }

    #[test]
    fn shipped_example_fleets_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fleets");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            FleetSpec::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 3);
    }

    #[test]
    fn bad_fleets_get_typed_errors() {
        assert!(matches!(
            FleetSpec::from_yaml("pods:\n  - {name: a, profile: nope}\n"),
            Err(SimError::UnknownProfile(..))
        ));
        assert!(matches!(
            FleetSpec::from_yaml(
                "pods:\n  - {name: a, profile: llama-3.1-8b/h100}\n  - {name: a, profile: llama-3.1-8b/h100}\n"
            ),
            Err(SimError::FleetInvalid(_))
        ));
        assert!(matches!(
            FleetSpec::from_yaml("pods: 3"),
            Err(SimError::FleetYaml(_))
        ));
        assert!(matches!(
            FleetSpec::from_yaml("pods: []"),
            Err(SimError::FleetInvalid(_))
        ));
    }

    fn invalid(text: &str) -> String {
        match FleetSpec::from_yaml(text) {
            Err(SimError::FleetInvalid(m)) => m,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn fault_values_out_of_range_are_refused_naming_pod_and_field() {
        let pod = |fault: &str| {
            format!("pods:\n  - {{name: a, profile: llama-3.1-8b/h100, faults: [{fault}]}}\n")
        };
        for (fault, says) in [
            (
                "{at_s: 1, error_rate: 2.0}",
                "error_rate: 2 must be between 0 and 1",
            ),
            (
                "{at_s: 1, error_rate: -1}",
                "error_rate: -1 must be between 0 and 1",
            ),
            ("{at_s: 1, slowdown: -1}", "slowdown: -1 must be above 0"),
            ("{at_s: 1, slowdown: 0}", "slowdown: 0 must be above 0"),
            ("{at_s: 1, slowdown: .nan}", "slowdown: NaN must be above 0"),
            ("{at_s: -5, hang: true}", "at_s: -5 must be 0 or more"),
        ] {
            let m = invalid(&pod(fault));
            assert!(
                m.starts_with("pod a: fault ") && m.contains(says),
                "{fault}: {m}"
            );
        }
        // The bounds themselves are values a user means.
        FleetSpec::from_yaml(&pod("{at_s: 0, error_rate: 1, slowdown: 0.5}")).unwrap();
    }

    #[test]
    fn fixed_ports_that_overlap_or_overflow_are_refused() {
        let m = invalid(
            "pods:\n  - {name: a, profile: llama-3.1-8b/h100, port: 30000, replicas: 2}\n  - {name: b, profile: llama-3.1-8b/h100, port: 30001}\n",
        );
        assert!(
            m.contains("pods a-1 and b both listen on port 30001"),
            "{m}"
        );
        let m =
            invalid("pods:\n  - {name: a, profile: llama-3.1-8b/h100, port: 65535, replicas: 2}\n");
        assert!(
            m.contains("port 65535 with replicas: 2 runs past port 65535"),
            "{m}"
        );
        // Adjacent ranges and any number of pods on port 0 are fine.
        let spec = FleetSpec::from_yaml(
            "pods:\n  - {name: a, profile: llama-3.1-8b/h100, port: 30000, replicas: 2}\n  - {name: b, profile: llama-3.1-8b/h100, port: 30002}\n  - {name: c, profile: llama-3.1-8b/h100, replicas: 3}\n",
        )
        .unwrap();
        let ports: Vec<u16> = spec.pods.iter().map(|p| p.port).collect();
        assert_eq!(ports, [30000, 30001, 30002, 0, 0, 0]);
    }
}
