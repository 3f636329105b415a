//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the simulator and emulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// An embedded or user-supplied profile table did not parse.
    #[error("profile table {name} is not valid YAML for profiles")]
    ProfileYaml {
        /// Which table.
        name: String,
        /// The parser's complaint.
        #[source]
        source: serde_yaml::Error,
    },
    /// A profile's numbers are unusable (zero capacity, negative cost, ...).
    #[error("profile {id} is invalid: {reason}")]
    ProfileInvalid {
        /// Profile id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// A fleet names a profile that does not exist.
    #[error("unknown profile {0:?}; known profiles: {1}")]
    UnknownProfile(String, String),
    /// A fleet file did not parse.
    #[error("fleet file is not valid")]
    FleetYaml(#[source] serde_yaml::Error),
    /// A fleet file could not be read.
    #[error("cannot read fleet file {path}")]
    FleetRead {
        /// The path.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A fleet is structurally wrong (no pods, duplicate names, ...).
    #[error("fleet is invalid: {0}")]
    FleetInvalid(String),
    /// A request named a pod index that the fleet does not have.
    #[error("no pod with index {0}")]
    NoSuchPod(usize),
    /// A request arrived before the simulator's current time.
    #[error("request arrival {arrival}s is before the current virtual time {now}s")]
    ArrivalInPast {
        /// Arrival time of the request (s).
        arrival: f64,
        /// Current virtual time (s).
        now: f64,
    },
    /// A request can never be served by the pod (prompt larger than its KV cache, unknown adapter).
    #[error("request rejected: {0}")]
    Rejected(String),
    /// The pod failed the request at once, by its `error_rate` fault (a model server answering
    /// HTTP 500 before any engine work, its metrics unchanged): the caller may try another pod.
    #[error(
        "pod {0} failed the request (its error_rate fault: an HTTP 500 before any engine work)"
    )]
    Failed(usize),
    /// A token id that no text produces (see [`crate::tokens`]).
    #[error("token id {0} is not in the emulator's vocabulary")]
    UnknownToken(u32),
    /// A pod's listener could not be bound (the port is taken, or the address is not local).
    #[error("pod {pod}: cannot listen on {addr}")]
    Bind {
        /// The pod.
        pod: String,
        /// The address it was to listen on.
        addr: std::net::SocketAddr,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A pod's KV-event ports are unusable: past 65535, or another pod's HTTP port.
    #[error("pod {pod}: KV-event port {port}: {reason}")]
    KvPort {
        /// The pod.
        pod: String,
        /// The port it was to publish or replay on (above 65535 when past the range).
        port: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// A pod's KV-event sockets could not be bound (on the pod's own address).
    #[error("pod {pod}: cannot publish KV events on port {events}{}", replay_note(*.replay))]
    KvBind {
        /// The pod.
        pod: String,
        /// The `PUB` socket's port.
        events: u16,
        /// The replay socket's port.
        replay: Option<u16>,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// Binding or serving a socket failed.
    #[error("emulator IO failed")]
    Io(#[from] std::io::Error),
}

fn replay_note(replay: Option<u16>) -> String {
    replay.map_or_else(String::new, |r| format!(" and replay them on port {r}"))
}
