//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong loading a scenario, running it or writing its report.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A scenario file could not be read.
    #[error("cannot read scenario file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A scenario file is not valid YAML for a scenario; `field` is the path of the offending key.
    #[error("scenario {origin}: field `{field}` is invalid")]
    Parse {
        /// File name (or `<inline>`).
        origin: String,
        /// Dotted path of the field, e.g. `workload.arrival.rate`.
        field: String,
        /// The parser's complaint.
        #[source]
        source: serde_yaml::Error,
    },
    /// A scenario parsed but a value is out of range or inconsistent.
    #[error("scenario {origin}: field `{field}` {reason}")]
    Invalid {
        /// File name (or `<inline>`).
        origin: String,
        /// Dotted path of the field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A pod's profile or the fleet built from the scenario was rejected by the simulator.
    #[error("scenario {origin}: field `{field}` is rejected by the simulator")]
    Fleet {
        /// File name (or `<inline>`).
        origin: String,
        /// Dotted path of the field.
        field: String,
        /// The simulator's error.
        #[source]
        source: infergate_sim::SimError,
    },
    /// The scenario cannot give what the run asked for.
    #[error("scenario {origin}: {what} cannot be kept for it")]
    Unsupported {
        /// File name (or `<inline>`).
        origin: String,
        /// What was asked for.
        what: &'static str,
    },
    /// The simulator failed while running.
    #[error("simulation failed")]
    Sim(#[from] infergate_sim::SimError),
    /// The scheduler configuration of a policy was rejected.
    #[error("policy {policy} cannot be configured")]
    Scheduler {
        /// The policy name.
        policy: String,
        /// The scheduler's error.
        #[source]
        source: infergate_scheduler::Error,
    },
    /// A report file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The gateway could not be started for a live run.
    #[error("the gateway for policy {policy} did not start")]
    Gateway {
        /// The policy.
        policy: String,
        /// The gateway's error.
        #[source]
        source: infergate_proxy::Error,
    },
    /// The gateway's configuration built for a live run was refused.
    #[error("the gateway configuration for policy {policy} was refused")]
    GatewayConfig {
        /// The policy.
        policy: String,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A socket for a live run could not be bound.
    #[error("cannot bind 127.0.0.1 for the live run")]
    Bind(#[source] std::io::Error),
    /// The gateway never became ready (no pod answered its scrapes).
    #[error("the gateway for policy {0} did not become ready within 10 s")]
    NotReady(String),
    /// Two external fronts have the same name.
    #[error(
        "two fronts are named {0}: each needs a name of its own (its row in the report, its log)"
    )]
    DuplicateFront(String),
    /// An external front's command is not valid `sh` (found by `sh -n` before any run).
    #[error("front {front}: its command is not valid sh ({complaint}); nothing was run")]
    FrontSyntax {
        /// The front's name.
        front: String,
        /// What `sh -n` said.
        complaint: String,
    },
    /// The program an external front's command runs first is not there (found before any run).
    #[error("front {front}: its command runs `{program}`, which {why}; nothing was run")]
    FrontProgram {
        /// The front's name.
        front: String,
        /// The program, as the command names it.
        program: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An external front's command could not be started.
    #[error("front {front}: cannot run its command with sh")]
    FrontStart {
        /// The front's name.
        front: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// An external front exited before it was ready.
    #[error(
        "front {front} exited ({status}) before answering GET /v1/models; its output is in {}{}",
        log.display(),
        if tail.is_empty() { String::new() } else { format!(", ending: {tail}") }
    )]
    FrontExited {
        /// The front's name.
        front: String,
        /// How it exited.
        status: String,
        /// Its output.
        log: PathBuf,
        /// The last lines of its output (empty if it wrote nothing).
        tail: String,
    },
    /// An external front did not answer `GET /v1/models` with 200 in time.
    #[error("front {front} did not answer GET /v1/models with 200 within {secs} s (last try: {last}); its output is in {}", log.display())]
    FrontNotReady {
        /// The front's name.
        front: String,
        /// The time allowed.
        secs: u64,
        /// What the last try got (`HTTP 404`, a connection error, …).
        last: String,
        /// Its output.
        log: PathBuf,
    },
    /// The model's tokenizer for a live run's prompts could not be loaded or used.
    #[error("cannot use the tokenizer in {}", dir.display())]
    Tokenizer {
        /// Its directory.
        dir: PathBuf,
        /// The tokenizer's error.
        #[source]
        source: infergate_tokenizer::Error,
    },
    /// The model's tokenizer loaded, but live prompts cannot be made with it.
    #[error("the tokenizer in {} {why}", dir.display())]
    TokenizerUnfit {
        /// Its directory.
        dir: PathBuf,
        /// What it lacks.
        why: &'static str,
    },
    /// A JSON report could not be encoded.
    #[error("cannot encode the JSON report")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// Whether this is an external front that did not start (its command could not be run,
    /// exited, or never got ready): a failure of that front's run, which the report records,
    /// rather than of the bench.
    pub fn is_front_start(&self) -> bool {
        matches!(
            self,
            BenchError::FrontStart { .. }
                | BenchError::FrontExited { .. }
                | BenchError::FrontNotReady { .. }
        )
    }

    /// Whether this is the gateway of a live run that did not start (its configuration was
    /// refused, it could not listen or start, or it never got ready): a failure of that
    /// policy's run, which the report records, rather than of the bench.
    pub fn is_gateway_start(&self) -> bool {
        matches!(
            self,
            BenchError::GatewayConfig { .. }
                | BenchError::Gateway { .. }
                | BenchError::Bind(_)
                | BenchError::NotReady(_)
        )
    }

    /// This error and its causes, each after the one it explains, joined by `: ` (one line
    /// for a report, where the causes are not printed by a caller as `anyhow` does).
    pub fn with_causes(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cause = c.source();
        }
        out
    }
}
