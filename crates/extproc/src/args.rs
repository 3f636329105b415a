//! The command lines of `infergate picker` and `infergate bbr`, as one contract.
//!
//! The binary parses these structs (clap), and the operator builds them and turns them into the
//! `args` of the containers it renders with [`command_line`]. Both sides therefore share every
//! flag name, default and port: a flag renamed here is renamed in what the operator renders, and
//! [`command_line`] refuses a value it cannot express as a flag. The file formats those flags
//! point at are shared the same way: the picker's `--config` is a serialised
//! [`SchedulerConfig`](infergate_scheduler::SchedulerConfig) and the BBR's `--models` a
//! [`ModelsFile`](crate::bbr::ModelsFile).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use infergate_pool::precise;
use infergate_pool::tls::Certificate;
use infergate_scheduler::EngineType;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::picker::DEFAULT_MAX_BODY_BYTES;

/// Default ext_proc port of the endpoint picker (the Gateway API Inference Extension's).
pub const PICKER_GRPC_PORT: u16 = 9002;
/// Default gRPC health port of the endpoint picker.
pub const PICKER_HEALTH_PORT: u16 = 9003;
/// Default ext_proc port of the body-based router.
pub const BBR_GRPC_PORT: u16 = 9004;
/// Default gRPC health port of the body-based router.
pub const BBR_HEALTH_PORT: u16 = 9005;
/// Default metrics port of both (`/metrics`, `/healthz`, `/readyz`; the picker also `/heartbeat`).
pub const METRICS_PORT: u16 = 9090;
/// Default port of the picker replicas' load exchange (`--peer-port`).
pub const PEER_PORT: u16 = infergate_pool::peers::DEFAULT_PEER_PORT;
/// The smallest `--max-body-bytes` of either process: the CRD's minimum for
/// `spec.bbr.maxRequestBodyBytes`, which the operator renders as that flag. A smaller cap would
/// answer every real request with 413.
pub const MIN_MAX_BODY_BYTES: usize = 1024;

/// The flags that turn TLS on for the ext_proc port (`--tls-cert-file`, `--tls-self-signed`):
/// `--tls-client-ca-file` needs one of them.
const TLS_SERVER: &str = "tls_server";

/// Arguments of `infergate picker`: the Envoy ext_proc endpoint picker for one InferencePool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct PickerArgs {
    /// The InferencePool this picker serves.
    #[arg(long, env = "POOL_NAME", default_value = "default")]
    pub pool_name: String,
    /// The InferencePool's namespace.
    #[arg(long, env = "POOL_NAMESPACE", default_value = "default")]
    pub pool_namespace: String,
    /// Scheduler configuration (YAML: `preset: infergate`, or explicit weights).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Static discovery: a YAML file of the pool's endpoints, `endpoints:` then one
    /// `- address: IP:PORT` entry per pod (docs/extproc.md). Without it, pods are discovered in
    /// Kubernetes.
    #[arg(long)]
    pub endpoints_file: Option<PathBuf>,
    /// Address every port is bound on (default: all interfaces). Set it to the pod's IP, or,
    /// as the tests do, to one loopback address per process.
    #[arg(long, env = "INFERGATE_LISTEN_ADDRESS")]
    pub listen_address: Option<IpAddr>,
    /// ext_proc gRPC port.
    #[arg(long, default_value_t = PICKER_GRPC_PORT)]
    pub grpc_port: u16,
    /// gRPC health port (`liveness`, `readiness`, and the ext_proc service).
    #[arg(long, default_value_t = PICKER_HEALTH_PORT)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port (`/metrics`, `/healthz`, `/readyz`, and `/heartbeat`: the pool's
    /// state as a global router polls it).
    #[arg(long, default_value_t = METRICS_PORT)]
    pub metrics_port: u16,
    /// Largest request body accepted (bytes, at least 1024); larger bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, value_parser = body_limit)]
    pub max_body_bytes: usize,
    /// Rewrite a model name on the way in, `REQUESTED=SERVED` (repeatable); responses get the
    /// requested name back.
    #[arg(long = "model-rewrite", value_name = "REQUESTED=SERVED")]
    pub model_rewrites: Vec<String>,
    /// Per-tenant quotas: a YAML file with the gateway's `quotas:` fields
    /// (`infergate_pool::quota::spec`), read at start.
    #[arg(long, value_name = "FILE")]
    pub quotas: Option<PathBuf>,
    /// Flow control: a YAML file with the gateway's `flowControl:` and `tenancy:` sections
    /// (`infergate_pool::flow::FlowSettings`), read at start. The tenant is
    /// `x-llm-d-inference-fairness-id`, the priority the objective `x-llm-d-inference-objective`
    /// names.
    #[arg(long, value_name = "FILE")]
    pub flow_control: Option<PathBuf>,
    /// Model rewrites and canary splits: a YAML list of `InferenceModelRewrite`-style rules
    /// (see `infergate_extproc::canary`), reloaded when the file changes.
    #[arg(long)]
    pub rewrites: Option<PathBuf>,
    /// Engine of pods without the `inference.networking.k8s.io/engine-type` label (with
    /// `--endpoints-file`: of entries for which neither the entry nor the file names one). It
    /// decides which metric names are scraped.
    #[arg(long, value_name = "ENGINE", ignore_case = true, value_parser = engines())]
    pub default_engine: Option<String>,
    /// Seed of the scheduler's tie-breaking random generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Answer a request that carries `x-infergate-explain: 1` with the routing decision's summary
    /// in an `x-infergate-explain` response header (off by default: it shows the pool's pods).
    #[arg(long, env = "INFERGATE_EXPLAIN_HEADER")]
    pub explain_header: bool,
    /// Threads serving ext_proc: 1 is a single-threaded runtime (the cheapest per request); more
    /// give a multi-thread runtime with that many workers.
    #[arg(long, env = "INFERGATE_PICKER_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
    /// The ext_proc port's TLS (`--tls-*`).
    #[command(flatten)]
    #[serde(flatten)]
    pub tls_flags: ExtProcTlsArgs,
    /// The metrics port's TLS (`--metrics-tls-*`).
    #[command(flatten)]
    #[serde(flatten)]
    pub metrics_tls_flags: MetricsTlsArgs,
    /// Active-active replicas: take part in the exchange of in-flight load with the pool's other
    /// picker replicas, authenticated by the shared key in this file (at least 16 bytes; every
    /// replica holds the same). Listens on `--peer-port` and dials every `--peer`.
    #[arg(long, env = "INFERGATE_PEER_KEY_FILE", value_name = "FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Where the other replicas' exchange listens, `HOST:PORT` (repeatable): an address, or a
    /// name resolved every few seconds — a headless Service over the replicas gives them all
    /// (this replica's own address among them is recognised and skipped).
    #[arg(long = "peer", value_name = "HOST:PORT", requires = "peer_key_file")]
    pub peers: Vec<String>,
    /// Port of the peer exchange (with `--peer-key-file`; default 9006).
    #[arg(long, requires = "peer_key_file")]
    pub peer_port: Option<u16>,
    /// Shortest milliseconds between two reports to the peers (default 5): a change of this
    /// replica's load is pushed at once, or coalesced with the next ones into one report at the
    /// end of the interval when the previous report is more recent.
    #[arg(long, requires = "peer_key_file",
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub peer_interval_ms: Option<u64>,
    /// This replica's name among its peers (unique per replica; in Kubernetes the pod's name).
    /// Default: `$HOSTNAME`.
    #[arg(long, env = "POD_NAME")]
    pub replica_name: Option<String>,
    /// Precise prefix routing: subscribe to every pod's KV-cache events on this port (vLLM's
    /// `--kv-events-config` `endpoint`, e.g. `tcp://*:5557`) and match each request's tokens
    /// against what the pods hold. Needs `--tokenizer`.
    #[arg(long, requires = "tokenizer", value_parser = clap::value_parser!(u16).range(1..))]
    pub kv_events_port: Option<u16>,
    /// The engines' KV-event replay port (`replay_endpoint`), used to fill gaps.
    #[arg(long, requires = "kv_events_port", value_parser = clap::value_parser!(u16).range(1..))]
    pub kv_events_replay_port: Option<u16>,
    /// The KV-event topic subscribed to (vLLM's `topic`; default: all).
    #[arg(long, requires = "kv_events_port")]
    pub kv_events_topic: Option<String>,
    /// The precise index's memory bound in bytes (default 256 MiB, at least 1 MiB), shared by
    /// the pods.
    #[arg(long, requires = "kv_events_port",
          value_parser = clap::value_parser!(u64).range(precise::BYTE_BUDGET_RANGE.0..=precise::BYTE_BUDGET_RANGE.1))]
    pub kv_index_bytes: Option<u64>,
    /// Request bodies longer than this are not tokenized for precise routing (default 65536, at
    /// least 1024): tokenizing costs about 1 ms of the picker's core per 1,000 tokens.
    #[arg(long, requires = "kv_events_port", value_parser = kv_body_limit)]
    pub kv_max_body_bytes: Option<usize>,
    /// The model's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`, optionally
    /// `chat_template.jinja`; e.g. a mounted ConfigMap), for `--kv-events-port`.
    #[arg(long, value_name = "DIR", requires = "kv_events_port")]
    pub tokenizer: Option<PathBuf>,
}

impl PickerArgs {
    /// The arguments with every default, for the pool `name` in `namespace`.
    pub fn new(name: &str, namespace: &str) -> Self {
        PickerArgs {
            pool_name: name.to_owned(),
            pool_namespace: namespace.to_owned(),
            config: None,
            endpoints_file: None,
            listen_address: None,
            grpc_port: PICKER_GRPC_PORT,
            grpc_health_port: PICKER_HEALTH_PORT,
            metrics_port: METRICS_PORT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            model_rewrites: Vec::new(),
            quotas: None,
            flow_control: None,
            rewrites: None,
            default_engine: None,
            seed: 0,
            explain_header: false,
            threads: 1,
            tls_flags: ExtProcTlsArgs::default(),
            metrics_tls_flags: MetricsTlsArgs::default(),
            peer_key_file: None,
            peers: Vec::new(),
            peer_port: None,
            peer_interval_ms: None,
            replica_name: None,
            kv_events_port: None,
            kv_events_replay_port: None,
            kv_events_topic: None,
            kv_index_bytes: None,
            kv_max_body_bytes: None,
            tokenizer: None,
        }
    }

    /// Precise prefix routing's settings, when `--kv-events-port` is given.
    pub fn precise(&self) -> Option<precise::PreciseConfig> {
        let port = self.kv_events_port?;
        let tokenizer = self.tokenizer.clone()?;
        let mut cfg = precise::PreciseConfig::new(tokenizer);
        cfg.events_port = port;
        cfg.replay_port = self.kv_events_replay_port;
        if let Some(t) = &self.kv_events_topic {
            cfg.topic = t.clone();
        }
        if let Some(b) = self.kv_index_bytes {
            cfg.byte_budget = b;
        }
        if let Some(b) = self.kv_max_body_bytes {
            cfg.max_body_bytes = b;
        }
        Some(cfg)
    }

    /// The ext_proc port's certificate, when TLS is asked for.
    pub fn tls(&self) -> Option<Certificate> {
        self.tls_flags.certificate(self.listen_address)
    }

    /// The metrics port's certificate files, when HTTPS is asked for there.
    pub fn metrics_tls(&self) -> Option<MetricsTlsFiles> {
        self.metrics_tls_flags.files()
    }
}

/// Arguments of `infergate bbr`: the Envoy ext_proc body-based router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct BbrArgs {
    /// Served models and their LoRA adapters (YAML map: model → list of adapters).
    #[arg(long)]
    pub models: PathBuf,
    /// Address every port is bound on (default: all interfaces). Set it to the pod's IP, or,
    /// as the tests do, to one loopback address per process.
    #[arg(long, env = "INFERGATE_LISTEN_ADDRESS")]
    pub listen_address: Option<IpAddr>,
    /// ext_proc gRPC port.
    #[arg(long, default_value_t = BBR_GRPC_PORT)]
    pub grpc_port: u16,
    /// gRPC health port; 0 disables it.
    #[arg(long, default_value_t = BBR_HEALTH_PORT)]
    pub grpc_health_port: u16,
    /// Prometheus metrics port; 0 disables it.
    #[arg(long, default_value_t = METRICS_PORT)]
    pub metrics_port: u16,
    /// Largest request body accepted (bytes, at least 1024); larger bodies get 413.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, value_parser = body_limit)]
    pub max_body_bytes: usize,
    /// The ext_proc port's TLS (`--tls-*`).
    #[command(flatten)]
    #[serde(flatten)]
    pub tls_flags: ExtProcTlsArgs,
    /// The metrics port's TLS (`--metrics-tls-*`).
    #[command(flatten)]
    #[serde(flatten)]
    pub metrics_tls_flags: MetricsTlsArgs,
}

impl BbrArgs {
    /// The arguments with every default, reading the models file at `models`.
    pub fn new(models: impl Into<PathBuf>) -> Self {
        BbrArgs {
            models: models.into(),
            listen_address: None,
            grpc_port: BBR_GRPC_PORT,
            grpc_health_port: BBR_HEALTH_PORT,
            metrics_port: METRICS_PORT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            tls_flags: ExtProcTlsArgs::default(),
            metrics_tls_flags: MetricsTlsArgs::default(),
        }
    }

    /// The ext_proc port's certificate, when TLS is asked for.
    pub fn tls(&self) -> Option<Certificate> {
        self.tls_flags.certificate(self.listen_address)
    }

    /// The metrics port's certificate files, when HTTPS is asked for there.
    pub fn metrics_tls(&self) -> Option<MetricsTlsFiles> {
        self.metrics_tls_flags.files()
    }
}

/// The flags of the ext_proc port's TLS, the same for `infergate picker` and `infergate bbr`:
/// one definition, so that their names, environment variables, help and the rules between
/// them (both files or a self-signed certificate, a client CA only with TLS) cannot drift apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[group(skip)]
pub struct ExtProcTlsArgs {
    /// Serve ext_proc over TLS with this PEM certificate chain (leaf first), reloaded when the
    /// file changes; needs `--tls-key-file`. The gRPC health port stays plaintext; the metrics
    /// port has its own `--metrics-tls-*` flags.
    #[arg(
        long,
        env = "INFERGATE_TLS_CERT_FILE",
        requires = "tls_key_file",
        conflicts_with = "tls_self_signed",
        group = TLS_SERVER
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `--tls-cert-file`.
    #[arg(long, env = "INFERGATE_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Serve ext_proc over TLS with a certificate generated at start, for a proxy that does not
    /// verify it (Envoy AI Gateway connects to an endpoint picker with TLS and accepts any
    /// certificate).
    #[arg(long, env = "INFERGATE_TLS_SELF_SIGNED", group = TLS_SERVER)]
    pub tls_self_signed: bool,
    /// Mutual TLS: a PEM CA bundle every client of the ext_proc port must present a certificate
    /// chained to (a client without one, or with another CA's, is refused at the handshake),
    /// reloaded when the file changes. Needs TLS on the port (`--tls-cert-file` or
    /// `--tls-self-signed`).
    #[arg(
        long,
        env = "INFERGATE_TLS_CLIENT_CA_FILE",
        value_name = "FILE",
        requires = TLS_SERVER
    )]
    pub tls_client_ca_file: Option<PathBuf>,
}

impl ExtProcTlsArgs {
    /// The certificate the flags name: the files (clap requires both), or a self-signed one for
    /// `localhost` and `listen_address` (unless it is every interface); `None` without TLS.
    pub fn certificate(&self, listen_address: Option<IpAddr>) -> Option<Certificate> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(Certificate::Files {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ if self.tls_self_signed => {
                let mut names = vec!["localhost".to_owned()];
                names.extend(
                    listen_address
                        .filter(|a| !a.is_unspecified())
                        .map(|a| a.to_string()),
                );
                Some(Certificate::SelfSigned { names })
            }
            _ => None,
        }
    }
}

/// The flags of the metrics port's TLS, the same for `infergate picker` and `infergate bbr`
/// (one definition, as [`ExtProcTlsArgs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[group(skip)]
pub struct MetricsTlsArgs {
    /// Serve the metrics port (`/metrics`, `/healthz`, `/readyz`, `/heartbeat`) over HTTPS with
    /// this PEM certificate chain (leaf first), reloaded when the file changes; needs
    /// `--metrics-tls-key-file`. Every connection to the port is then TLS, probes included.
    #[arg(
        long,
        env = "INFERGATE_METRICS_TLS_CERT_FILE",
        value_name = "FILE",
        requires = "metrics_tls_key_file"
    )]
    pub metrics_tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `--metrics-tls-cert-file`.
    #[arg(
        long,
        env = "INFERGATE_METRICS_TLS_KEY_FILE",
        value_name = "FILE",
        requires = "metrics_tls_cert_file"
    )]
    pub metrics_tls_key_file: Option<PathBuf>,
    /// Mutual TLS on the metrics port: a PEM CA bundle every client (a global router polling
    /// `/heartbeat`, Prometheus, a probe) must present a certificate chained to, reloaded when
    /// the file changes. Needs `--metrics-tls-cert-file`.
    #[arg(
        long,
        env = "INFERGATE_METRICS_TLS_CLIENT_CA_FILE",
        value_name = "FILE",
        requires = "metrics_tls_cert_file"
    )]
    pub metrics_tls_client_ca_file: Option<PathBuf>,
}

impl MetricsTlsArgs {
    /// The files, when both certificate files are given (clap requires both, and the
    /// certificate for a client CA).
    pub fn files(&self) -> Option<MetricsTlsFiles> {
        Some(MetricsTlsFiles {
            cert: self.metrics_tls_cert_file.clone()?,
            key: self.metrics_tls_key_file.clone()?,
            client_ca: self.metrics_tls_client_ca_file.clone(),
        })
    }
}

/// `--default-engine`: the engines the metrics scraper knows, listed by clap when a value is
/// not one of them. (A string, not [`EngineType`], for the operator that builds these args.)
fn engines() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(EngineType::ALL.map(EngineType::as_str))
}

/// `--max-body-bytes`: a byte count of at least [`MIN_MAX_BODY_BYTES`].
fn body_limit(value: &str) -> Result<usize, String> {
    let n: usize = value
        .parse()
        .map_err(|e| format!("{e}: expected a number of bytes"))?;
    if n < MIN_MAX_BODY_BYTES {
        return Err(format!(
            "must be at least {MIN_MAX_BODY_BYTES} bytes (the CRD's minimum for \
             spec.bbr.maxRequestBodyBytes): a smaller cap answers every request with 413"
        ));
    }
    Ok(n)
}

/// `--kv-max-body-bytes`: the range [`precise::PreciseConfig::validate`] accepts.
fn kv_body_limit(value: &str) -> Result<usize, String> {
    let n: usize = value
        .parse()
        .map_err(|e| format!("{e}: expected a number of bytes"))?;
    let (min, max) = precise::MAX_BODY_BYTES_RANGE;
    if !(min..=max).contains(&(n as u64)) {
        return Err(format!(
            "must be between {min} and {max} bytes (the CRD's range for \
             spec.schedulers[].precisePrefix.maxBodyBytes)"
        ));
    }
    Ok(n)
}

/// The files of the metrics port's TLS (`--metrics-tls-cert-file`, `--metrics-tls-key-file`,
/// `--metrics-tls-client-ca-file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsTlsFiles {
    /// The PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its PEM private key.
    pub key: PathBuf,
    /// The PEM CA bundle clients must present a certificate of (`None`: no client
    /// certificate is asked for).
    pub client_ca: Option<PathBuf>,
}

/// The socket address of `port` on `listen_address` (all interfaces when unset).
pub fn socket_addr(listen_address: Option<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(
        listen_address.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        port,
    )
}

/// Why a value could not be written as a command line.
#[derive(Debug, thiserror::Error)]
pub enum CommandLineError {
    /// The arguments did not serialise.
    #[error("the arguments do not serialise")]
    Serialize(#[from] serde_json::Error),
    /// The arguments serialised to something other than a map of fields.
    #[error("the arguments are not a struct of fields")]
    NotAStruct,
    /// A field's value has no flag form (a map or a nested list).
    #[error("`--{flag}` cannot carry a {kind} value")]
    Unsupported {
        /// The flag.
        flag: String,
        /// What the value was.
        kind: &'static str,
    },
    /// A field of the struct has no flag: it would be lost on the way.
    #[error("field `{0}` has no command-line flag")]
    NoFlag(String),
}

/// `subcommand` followed by one `--flag=value` per set field of `args`, in the order clap
/// declares the flags: `None` and `false` are left out, `true` is a bare `--flag`, a list repeats
/// its flag. The flag names come from clap itself, so they are the ones the binary parses.
pub fn command_line<A>(subcommand: &str, args: &A) -> Result<Vec<String>, CommandLineError>
where
    A: clap::Args + Serialize,
{
    let command = A::augment_args(clap::Command::new("infergate"));
    let Value::Object(mut fields) = serde_json::to_value(args)? else {
        return Err(CommandLineError::NotAStruct);
    };
    let mut out = vec![subcommand.to_owned()];
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let Some(value) = fields.remove(arg.get_id().as_str()) else {
            continue;
        };
        match value {
            Value::Null | Value::Bool(false) => {}
            Value::Bool(true) => out.push(format!("--{long}")),
            Value::Array(items) => {
                for item in items {
                    out.push(format!("--{long}={}", scalar(long, item)?));
                }
            }
            v => out.push(format!("--{long}={}", scalar(long, v)?)),
        }
    }
    match fields.into_iter().next() {
        Some((field, _)) => Err(CommandLineError::NoFlag(field)),
        None => Ok(out),
    }
}

fn scalar(flag: &str, v: Value) -> Result<String, CommandLineError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        Value::Array(_) => Err(CommandLineError::Unsupported {
            flag: flag.to_owned(),
            kind: "nested list",
        }),
        Value::Object(_) => Err(CommandLineError::Unsupported {
            flag: flag.to_owned(),
            kind: "map",
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use clap::{FromArgMatches as _, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Picker {
        #[command(flatten)]
        args: PickerArgs,
    }

    #[derive(Debug, Parser)]
    struct Bbr {
        #[command(flatten)]
        args: BbrArgs,
    }

    #[test]
    fn picker_command_line_parses_back_to_the_same_arguments() {
        let mut a = PickerArgs::new("pool", "ns");
        a.config = Some("/etc/infergate/scheduler.yaml".into());
        a.default_engine = Some("sglang".to_owned());
        a.model_rewrites = vec!["a=b".to_owned(), "c=d".to_owned()];
        a.grpc_port = 19002;
        a.threads = 2;
        a.explain_header = true;
        a.tls_flags.tls_self_signed = true;
        a.tls_flags.tls_client_ca_file = Some("/etc/infergate/client-ca/ca.crt".into());
        let line = command_line("picker", &a).unwrap();
        assert!(
            line.contains(&"--tls-client-ca-file=/etc/infergate/client-ca/ca.crt".to_owned()),
            "{line:?}"
        );
        assert!(line.contains(&"--explain-header".to_owned()), "{line:?}");
        assert_eq!(line[0], "picker");
        assert!(line.contains(&"--model-rewrite=a=b".to_owned()), "{line:?}");
        assert!(line.contains(&"--grpc-port=19002".to_owned()), "{line:?}");
        let parsed = Picker::try_parse_from(&line).unwrap().args;
        assert_eq!(parsed, a);
    }

    #[test]
    fn explanations_are_off_unless_asked_for() {
        assert!(
            !Picker::try_parse_from(["picker"])
                .unwrap()
                .args
                .explain_header
        );
        let on = Picker::try_parse_from(["picker", "--explain-header"]).unwrap();
        assert!(on.args.explain_header);
    }

    #[test]
    fn defaults_of_new_are_the_parsers_defaults() {
        let parsed = Picker::try_parse_from(["picker"]).unwrap().args;
        assert_eq!(parsed, PickerArgs::new("default", "default"));
        let parsed = Bbr::try_parse_from(["bbr", "--models=m.yaml"])
            .unwrap()
            .args;
        assert_eq!(parsed, BbrArgs::new("m.yaml"));
    }

    #[test]
    fn bbr_command_line_parses_back_to_the_same_arguments() {
        let mut a = BbrArgs::new("/etc/infergate/models.yaml");
        a.max_body_bytes = 1234;
        a.grpc_health_port = 0;
        a.tls_flags.tls_cert_file = Some("/etc/infergate/tls/tls.crt".into());
        a.tls_flags.tls_key_file = Some("/etc/infergate/tls/tls.key".into());
        a.tls_flags.tls_client_ca_file = Some("/etc/infergate/tls/ca.crt".into());
        let line = command_line("bbr", &a).unwrap();
        assert!(
            line.contains(&"--tls-client-ca-file=/etc/infergate/tls/ca.crt".to_owned()),
            "{line:?}"
        );
        let matches = Bbr::command_for_test().try_get_matches_from(&line).unwrap();
        assert_eq!(BbrArgs::from_arg_matches(&matches).unwrap(), a);
    }

    #[test]
    fn precise_sizes_are_refused_outside_the_crds_range() {
        let base = ["picker", "--kv-events-port=5557", "--tokenizer=/t"];
        let parse = |extra: &str| {
            let mut line = base.to_vec();
            line.push(extra);
            Picker::try_parse_from(line).map(|p| p.args)
        };
        let ok = parse("--kv-max-body-bytes=1024").unwrap();
        assert_eq!(ok.precise().unwrap().max_body_bytes, 1024);
        ok.precise().unwrap().validate().unwrap();
        let max = parse("--kv-index-bytes=68719476736").unwrap();
        max.precise().unwrap().validate().unwrap();
        for bad in [
            "--kv-max-body-bytes=0",
            "--kv-max-body-bytes=1023",
            "--kv-max-body-bytes=268435457",
            "--kv-index-bytes=0",
            "--kv-index-bytes=1048575",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn tls_flags_name_both_files_or_a_self_signed_certificate() {
        assert!(Picker::try_parse_from(["picker", "--tls-cert-file=c.pem"]).is_err());
        assert!(Bbr::try_parse_from(["bbr", "--models=m", "--tls-key-file=k.pem"]).is_err());
        let both = [
            "picker",
            "--tls-cert-file=c.pem",
            "--tls-key-file=k.pem",
            "--tls-self-signed",
        ];
        assert!(Picker::try_parse_from(both).is_err());
        assert_eq!(Picker::try_parse_from(["picker"]).unwrap().args.tls(), None);
        let a =
            Picker::try_parse_from(["picker", "--tls-self-signed", "--listen-address=10.0.0.7"])
                .unwrap()
                .args;
        assert_eq!(
            a.tls(),
            Some(Certificate::SelfSigned {
                names: vec!["localhost".into(), "10.0.0.7".into()]
            })
        );
        let b = Bbr::try_parse_from([
            "bbr",
            "--models=m",
            "--tls-cert-file=c.pem",
            "--tls-key-file=k.pem",
        ])
        .unwrap()
        .args;
        assert_eq!(
            b.tls(),
            Some(Certificate::Files {
                cert: "c.pem".into(),
                key: "k.pem".into()
            })
        );
    }

    /// `--tls-client-ca-file` goes with either way of turning TLS on, and is refused without
    /// one, naming both, for both processes.
    #[test]
    fn a_client_ca_needs_tls_on_the_port() {
        let err = Picker::try_parse_from(["picker", "--tls-client-ca-file=ca.pem"]).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{err}"
        );
        let text = err.render().to_string();
        assert!(
            text.contains("--tls-cert-file") && text.contains("--tls-self-signed"),
            "{text}"
        );
        let err =
            Bbr::try_parse_from(["bbr", "--models=m", "--tls-client-ca-file=ca.pem"]).unwrap_err();
        assert_eq!(
            err.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{err}"
        );
        let a =
            Picker::try_parse_from(["picker", "--tls-self-signed", "--tls-client-ca-file=ca.pem"])
                .unwrap()
                .args;
        assert_eq!(a.tls_flags.tls_client_ca_file, Some("ca.pem".into()));
        assert!(matches!(a.tls(), Some(Certificate::SelfSigned { .. })));
        let b = Bbr::try_parse_from([
            "bbr",
            "--models=m",
            "--tls-cert-file=c.pem",
            "--tls-key-file=k.pem",
            "--tls-client-ca-file=ca.pem",
        ])
        .unwrap()
        .args;
        assert_eq!(b.tls_flags.tls_client_ca_file, Some("ca.pem".into()));
        // Without it, no client certificate is asked for.
        assert_eq!(
            Picker::try_parse_from(["picker", "--tls-self-signed"])
                .unwrap()
                .args
                .tls_flags
                .tls_client_ca_file,
            None
        );
    }

    /// The metrics port's TLS flags go through [`command_line`] and back for both processes,
    /// are read as one set of files, and a key or a client CA without the certificate is
    /// refused by the parser naming the certificate's flag.
    #[test]
    fn metrics_tls_flags_round_trip_and_need_the_certificate() {
        let mut p = PickerArgs::new("pool", "ns");
        let mut b = BbrArgs::new("/etc/infergate/models.yaml");
        for (cert, key, ca) in [
            (
                &mut p.metrics_tls_flags.metrics_tls_cert_file,
                &mut p.metrics_tls_flags.metrics_tls_key_file,
                &mut p.metrics_tls_flags.metrics_tls_client_ca_file,
            ),
            (
                &mut b.metrics_tls_flags.metrics_tls_cert_file,
                &mut b.metrics_tls_flags.metrics_tls_key_file,
                &mut b.metrics_tls_flags.metrics_tls_client_ca_file,
            ),
        ] {
            *cert = Some("/etc/infergate/metrics-tls/tls.crt".into());
            *key = Some("/etc/infergate/metrics-tls/tls.key".into());
            *ca = Some("/etc/infergate/metrics-tls/ca.crt".into());
        }
        let expected = MetricsTlsFiles {
            cert: "/etc/infergate/metrics-tls/tls.crt".into(),
            key: "/etc/infergate/metrics-tls/tls.key".into(),
            client_ca: Some("/etc/infergate/metrics-tls/ca.crt".into()),
        };
        let line = command_line("picker", &p).unwrap();
        for flag in [
            "--metrics-tls-cert-file=/etc/infergate/metrics-tls/tls.crt",
            "--metrics-tls-key-file=/etc/infergate/metrics-tls/tls.key",
            "--metrics-tls-client-ca-file=/etc/infergate/metrics-tls/ca.crt",
        ] {
            assert!(line.contains(&flag.to_owned()), "{line:?}");
        }
        let parsed = Picker::try_parse_from(&line).unwrap().args;
        assert_eq!(parsed, p);
        assert_eq!(parsed.metrics_tls(), Some(expected.clone()));
        // The ext_proc port is untouched by them.
        assert_eq!(parsed.tls(), None);
        let line = command_line("bbr", &b).unwrap();
        let parsed = Bbr::try_parse_from(&line).unwrap().args;
        assert_eq!(parsed, b);
        assert_eq!(parsed.metrics_tls(), Some(expected));
        // Off unless asked for.
        assert_eq!(PickerArgs::new("p", "n").metrics_tls(), None);
        for line in [
            &["picker", "--metrics-tls-client-ca-file=ca.pem"][..],
            &["picker", "--metrics-tls-key-file=k.pem"],
            &["bbr", "--models=m", "--metrics-tls-client-ca-file=ca.pem"],
            &["bbr", "--models=m", "--metrics-tls-key-file=k.pem"],
        ] {
            let err = if line[0] == "picker" {
                Picker::try_parse_from(line).unwrap_err()
            } else {
                Bbr::try_parse_from(line).unwrap_err()
            };
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{line:?}: {err}"
            );
            assert!(
                err.render().to_string().contains("--metrics-tls-cert-file"),
                "{line:?}: {err}"
            );
        }
        // A certificate without its key is refused naming the key's flag.
        let err = Picker::try_parse_from(["picker", "--metrics-tls-cert-file=c.pem"]).unwrap_err();
        assert!(
            err.render().to_string().contains("--metrics-tls-key-file"),
            "{err}"
        );
    }

    #[test]
    fn a_field_without_a_flag_is_refused() {
        #[derive(Serialize, clap::Args)]
        struct Odd {
            #[arg(long)]
            kept: u32,
            #[arg(skip)]
            hidden: u32,
        }
        let err = command_line("odd", &Odd { kept: 1, hidden: 2 }).unwrap_err();
        assert!(matches!(err, CommandLineError::NoFlag(f) if f == "hidden"));
    }

    #[test]
    fn a_map_value_is_refused_with_the_flag_named() {
        #[derive(Serialize, clap::Args)]
        struct Odd {
            #[arg(long, value_parser = clap::value_parser!(String))]
            #[serde(serialize_with = "as_map")]
            table: String,
        }
        fn as_map<S: serde::Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(Some(1))?;
            m.serialize_entry("k", "v")?;
            m.end()
        }
        let err = command_line("odd", &Odd { table: "x".into() }).unwrap_err();
        assert_eq!(err.to_string(), "`--table` cannot carry a map value");
    }

    /// An engine the scraper does not know is refused when the arguments are parsed, with
    /// clap's list of the engines it knows (it used to start, then skip every pod).
    #[test]
    fn default_engine_is_one_of_the_known_engines() {
        let err = Picker::try_parse_from(["picker", "--default-engine=vlm"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let text = err.render().to_string();
        assert!(text.contains("'vlm'"), "{text}");
        assert!(text.contains("--default-engine"), "{text}");
        assert!(
            text.contains("[possible values: vllm, sglang, tgi]"),
            "{text}"
        );
        for engine in EngineType::ALL {
            let a = Picker::try_parse_from(["picker", &format!("--default-engine={engine}")])
                .unwrap()
                .args;
            assert_eq!(a.default_engine.as_deref(), Some(engine.as_str()));
        }
        // As the pod label, any case (the scraper parses it so).
        let a = Picker::try_parse_from(["picker", "--default-engine=SGLang"]).unwrap();
        assert_eq!(a.args.default_engine.as_deref(), Some("SGLang"));
    }

    /// Every engine the CRD offers (`spec.schedulers[].engineType`, rendered as
    /// `--default-engine`) is one the picker accepts.
    #[test]
    fn every_engine_of_the_crd_is_accepted() {
        use kube::CustomResourceExt as _;
        let crd = serde_json::to_value(infergate_api::InferenceGatewayConfig::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let engines = spec["properties"]["schedulers"]["items"]["properties"]["engineType"]["enum"]
            .as_array()
            .unwrap()
            .clone();
        assert!(engines.len() >= 3, "{engines:?}");
        for e in engines {
            let flag = format!("--default-engine={}", e.as_str().unwrap());
            Picker::try_parse_from(["picker", &flag]).unwrap();
        }
    }

    /// `--max-body-bytes` below the CRD's minimum is refused when the arguments are parsed (0
    /// used to start a picker that answered every request with 413), for both processes.
    #[test]
    fn max_body_bytes_below_the_crds_minimum_is_refused() {
        use kube::CustomResourceExt as _;
        let crd = serde_json::to_value(infergate_api::InferenceGatewayConfig::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let min = &spec["properties"]["bbr"]["properties"]["maxRequestBodyBytes"]["minimum"];
        assert_eq!(
            min.as_f64(),
            Some(MIN_MAX_BODY_BYTES as f64),
            "the CRD's minimum"
        );
        for bad in ["0", "1023", "-1", "4MiB"] {
            let flag = format!("--max-body-bytes={bad}");
            let err = Picker::try_parse_from(["picker", &flag]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
            let text = err.render().to_string();
            assert!(text.contains("--max-body-bytes"), "{text}");
            let err = Bbr::try_parse_from(["bbr", "--models=m", &flag]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
        let err = Picker::try_parse_from(["picker", "--max-body-bytes=0"]).unwrap_err();
        assert!(
            err.to_string().contains("must be at least 1024 bytes"),
            "{err}"
        );
        let a = Picker::try_parse_from(["picker", "--max-body-bytes=1024"]).unwrap();
        assert_eq!(a.args.max_body_bytes, 1024);
        let b = Bbr::try_parse_from(["bbr", "--models=m", "--max-body-bytes=1024"]).unwrap();
        assert_eq!(b.args.max_body_bytes, 1024);
    }

    impl Bbr {
        fn command_for_test() -> clap::Command {
            <Bbr as clap::CommandFactory>::command()
        }
    }
}
