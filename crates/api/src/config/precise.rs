//! Precise prefix routing of one scheduler: the model servers' KV-cache events and the model's
//! tokenizer (docs/precise-prefix.md).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation;

/// Precise prefix routing: the endpoint picker subscribes to every model-server pod's KV-cache
/// events (vLLM `--kv-events-config`) and matches each request's tokens, computed with the
/// model's own tokenizer, against what the pods hold.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::precise_rules)]
pub struct PrecisePrefixSpec {
    /// Where the model's tokenizer files are (`tokenizer.json`, `tokenizer_config.json`,
    /// optionally `chat_template.jinja`).
    pub tokenizer: TokenizerSource,
    /// The port the model servers publish KV events on (vLLM's `endpoint`, `tcp://*:PORT`).
    /// A pod label `infergate.io/kv-events-port` overrides it per pod.
    #[serde(default = "default_events_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub events_port: i32,
    /// The model servers' replay port (vLLM's `replay_endpoint`), used to fill gaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub replay_port: Option<i32>,
    /// The topic subscribed to (vLLM's `topic`; default: every topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub topic: Option<String>,
    /// The index's memory bound in bytes, shared by the pool's pods (default 256 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1048576, max = 68719476736_i64))]
    pub byte_budget: Option<i64>,
    /// Request bodies longer than this are not tokenized, keeping the approximate match
    /// (default 65536): tokenizing costs about 1 ms of the picker's core per 1,000 tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 268435456))]
    pub max_body_bytes: Option<i64>,
}

fn default_events_port() -> i32 {
    5557
}

/// A volume holding the tokenizer files: a ConfigMap (a tokenizer under 1 MiB) or a
/// PersistentVolumeClaim (any size).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::tokenizer_rules)]
pub struct TokenizerSource {
    /// A ConfigMap in the config's namespace whose keys are the files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map: Option<String>,
    /// A PersistentVolumeClaim in the config's namespace holding the files, mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub persistent_volume_claim: Option<String>,
    /// The directory within the claim that holds the files (default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), pattern(r"^[^/.][^\x00]*$"))]
    pub sub_path: Option<String>,
}
