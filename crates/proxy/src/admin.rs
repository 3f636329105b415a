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

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::registry::Registry;

use crate::proxy::Shared;

/// The gateway's series followed by each current pool's, then the end marker.
///
/// Every pool registers the same metric families (told apart by their `model` label), and the
/// exposition format allows each family once, with all its samples together: the registries are
/// encoded one after the other here, and the admin server merges the families that repeat by
/// name, in order of first appearance (`infergate_pool::admin::merge_families`).
pub(crate) fn encode_metrics(
    registry: &Registry,
    shared: &Shared,
) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    encode_registry(&mut out, registry)?;
    let state = shared.state.load();
    for model in state.router.targets() {
        encode_registry(&mut out, &model.backend.registry)?;
    }
    if let Some(registry) = state.quotas.as_ref().and_then(|q| q.registry()) {
        encode_registry(&mut out, registry)?;
    }
    encode_eof(&mut out)?;
    Ok(out)
}

/// The heartbeat document (`/heartbeat`, `infergate_pool::heartbeat`): one entry per model of
/// the configuration in force, naming the LoRA adapters its pods serve (a global router counts
/// the requests it sent for any of them against all of them: they queue on the same engines).
pub(crate) fn encode_heartbeat(
    heartbeats: &infergate_pool::heartbeat::Heartbeats,
    shared: &Shared,
) -> String {
    let state = shared.state.load();
    // Every served name with its base model: a model's adapters are the names whose base it
    // is, other than itself. Built per document, on the admin port.
    let names = state.router.models();
    heartbeats.render(state.router.targets().iter().map(|model| {
        let adapters = names
            .iter()
            .filter(|(name, base)| *base == &*model.name && *name != &*model.name)
            .map(|(name, _)| (*name).to_owned())
            .collect();
        infergate_pool::heartbeat::Entry {
            name: &model.name,
            adapters,
            pool: &model.backend.pool,
            flow_queue: model.flow.as_ref().map_or(0, |f| f.queued()),
        }
    }))
}
