//! What one loaded configuration turns into: the model table, each model's live pool and
//! metrics, and the prebuilt `/v1/models` answer. (Upstream connections belong to the workers,
//! not to a configuration: see `upstream`.)
//!
//! A reload builds a new [`State`] next to the old one and swaps it in atomically; requests
//! already running keep the `Arc` of the state they started with. Pools whose model and scheduler
//! configuration are unchanged are carried over (only their membership is updated), so their
//! in-flight accounting, learned rates and prefix index survive a reload.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use infergate_pool::flow::{FlowController, WeakFlowController};
use infergate_pool::lifecycle::{EndpointPool, InflightGuard};
use infergate_pool::{Changes, Inflight, LivePool};
use infergate_scheduler::{Rejection, RequestContext};

use bytes::Bytes;
use http::HeaderValue;
use infergate_openai::ModelRouter;
use infergate_scheduler::Rewrites;
use serde::Serialize;

use crate::access_log::{AccessLog, Note};
use crate::auth::{Authenticator, ModelAccess};
use crate::backend::Backend;
use crate::config::{CONCURRENCY_RETRY_AFTER, GatewayConfig};
use crate::error::Error;
use crate::telemetry::{ModelMetrics, Telemetry};

/// Per-endpoint values computed once: `ip:port`, the upstream request's `Host` and the
/// `x-infergate-endpoint` value.
pub(crate) struct EndpointHeaders {
    pub(crate) header: HeaderValue,
}

/// One served model.
pub(crate) struct Model {
    /// Shared, not copied, by the access log's lines of the requests it serves.
    pub(crate) name: Arc<str>,
    pub(crate) backend: Backend,
    pub(crate) metrics: ModelMetrics,
    pub(crate) endpoints: HashMap<SocketAddr, EndpointHeaders>,
    /// `maxConcurrentRequests`, and where it is taken.
    pub(crate) slots: Slots,
    /// The model's flow control (`flowControl.enabled`), kept with its queue across reloads
    /// that keep the pool and leave `flowControl:` and `tenancy:` unchanged.
    pub(crate) flow: Option<infergate_pool::flow::FlowController>,
}

/// Where a model's `maxConcurrentRequests` is taken, decided once per configuration.
pub(crate) enum Slots {
    /// No limit: nothing is counted.
    Unlimited,
    /// Before the pick: a model at its limit answers 429 `concurrency_limit`.
    BeforePick(Concurrency),
    /// With flow control, at dispatch, through the pool behind the limit: a model at its limit
    /// counts as saturated, so the request queues.
    AtDispatch(Gated),
}

impl Slots {
    /// The limit, wherever it is taken.
    fn concurrency(&self) -> Option<&Concurrency> {
        match self {
            Slots::Unlimited => None,
            Slots::BeforePick(c) => Some(c),
            Slots::AtDispatch(g) => Some(&g.slots),
        }
    }
}

/// A model's concurrency limit. The counter is carried over by reloads that keep a limit on the
/// model, so requests already running keep counting against the new maximum; a model without a
/// limit counts nothing (no shared counter touched per request).
#[derive(Clone)]
pub(crate) struct Concurrency {
    active: Arc<AtomicUsize>,
    max: usize,
    /// With flow control: notified when a slot frees (the pool's change signal), so the model's
    /// queue gives its head a turn. Without, nothing waits for a slot.
    freed: Option<Arc<Changes>>,
}

impl Concurrency {
    /// The configured limit.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Admits one more request, or `None` when `max` are already running.
    pub(crate) fn try_acquire(&self) -> Option<Permit> {
        let before = self.active.fetch_add(1, Ordering::AcqRel);
        if before >= self.max {
            self.active.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Permit {
            active: Arc::clone(&self.active),
            freed: self.freed.clone(),
        })
    }
}

/// One admitted request; dropping it (when the response ends, fails or is abandoned) frees the
/// slot, and with flow control wakes the model's queue.
pub(crate) struct Permit {
    active: Arc<AtomicUsize>,
    freed: Option<Arc<Changes>>,
}

impl Permit {
    /// Frees the slot without waking the queue: the pick it was taken for failed, so no room
    /// was made (waking the queue here would have its head retry in a loop while the pool is
    /// saturated).
    fn give_back(mut self) {
        self.freed = None;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
        if let Some(freed) = &self.freed {
            freed.signal();
        }
    }
}

/// A model's pool behind its concurrency limit, for models with flow control: at the limit a
/// pick is refused as saturated, so the request waits in the model's queue (and takes its slot
/// when it is dispatched) instead of being answered 429 `concurrency_limit`. Queued requests
/// hold no slot.
#[derive(Clone)]
pub(crate) struct Gated {
    pub(crate) pool: LivePool,
    pub(crate) slots: Concurrency,
}

/// A pick made through [`Gated`]: the in-flight entry and the slot it took.
pub(crate) struct GatedInflight {
    pub(crate) inflight: Inflight,
    pub(crate) permit: Permit,
}

impl Gated {
    fn at_limit(&self) -> Rejection {
        Rejection::Shed {
            retry_after: CONCURRENCY_RETRY_AFTER,
        }
    }
}

impl EndpointPool for Gated {
    type Inflight = GatedInflight;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<GatedInflight, Rejection> {
        let Some(permit) = self.slots.try_acquire() else {
            return Err(self.at_limit());
        };
        match EndpointPool::pick(&self.pool, cx) {
            Ok(inflight) => Ok(GatedInflight { inflight, permit }),
            Err(r) => {
                permit.give_back();
                Err(r)
            }
        }
    }

    fn is_ready(&self) -> bool {
        EndpointPool::is_ready(&self.pool)
    }

    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<GatedInflight, Rejection>, Option<String>) {
        let Some(permit) = self.slots.try_acquire() else {
            let why = format!(
                "chosen= policy=concurrency-limit priority={} running={} limit={}",
                cx.priority.as_str(),
                self.slots.active.load(Ordering::Acquire),
                self.slots.max
            );
            return (Err(self.at_limit()), Some(why));
        };
        match EndpointPool::pick_explained(&self.pool, cx) {
            (Ok(inflight), why) => (Ok(GatedInflight { inflight, permit }), why),
            (Err(r), why) => {
                permit.give_back();
                (Err(r), why)
            }
        }
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        EndpointPool::changes(&self.pool)
    }

    fn precise(&self) -> Option<&infergate_pool::precise::Precise> {
        EndpointPool::precise(&self.pool)
    }
}

impl InflightGuard for GatedInflight {
    fn endpoints(&self) -> &[SocketAddr] {
        InflightGuard::endpoints(&self.inflight)
    }

    fn reassign(&mut self, addr: SocketAddr) {
        InflightGuard::reassign(&mut self.inflight, addr);
    }

    fn first_token(&mut self) {
        InflightGuard::first_token(&mut self.inflight);
    }

    fn complete(self, usage: infergate_scheduler::Usage) {
        InflightGuard::complete(self.inflight, usage);
    }

    fn fail(self) {
        InflightGuard::fail(self.inflight);
    }

    fn answered(&mut self, status: u16) {
        InflightGuard::answered(&mut self.inflight, status);
    }
}

/// A loaded configuration, ready to serve.
pub(crate) struct State {
    pub(crate) config: GatewayConfig,
    pub(crate) router: ModelRouter<Arc<Model>>,
    /// The `/v1/models` answer for a caller who may call every model, built once.
    pub(crate) models_body: Bytes,
    /// Who may call, kept across reloads that leave `auth:` unchanged (with its cached keys).
    pub(crate) auth: Arc<Authenticator>,
    /// The compiled `rewrites:` (a reload starts their splits afresh).
    pub(crate) rewrites: Rewrites,
    /// The `quotas:` service, kept with its counts across reloads that leave `quotas:`
    /// unchanged.
    pub(crate) quotas: Option<infergate_pool::quota::Quotas>,
    /// How a request's tenant and priority are found (`tenancy:`).
    pub(crate) tenancy: infergate_pool::tenant::Tenancy,
    /// The flow controllers reloads replaced (a changed `flowControl:` or `tenancy:`, or a new
    /// pool) that were still alive at the last reload: requests queued in one still hold
    /// in-flight slots, so the door must still reach them to evict a Sheddable one
    /// ([`State::queues`]). Carried from reload to reload while anything holds them.
    pub(crate) retired_flows: Vec<WeakFlowController>,
    /// The access log (`accessLog:`), kept across reloads that leave its path unchanged.
    pub(crate) access_log: Option<Arc<AccessLog<Note>>>,
}

#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelEntry<'a>>,
}

/// One `/v1/models` entry, in vLLM's shape as far as the gateway knows it: `root` the base model
/// (vLLM gives a base model's path there, and an adapter's own path), `parent` an adapter's base
/// model and null for a base model, as vLLM gives it, so that a client reading vLLM's list reads
/// the gateway's alike.
#[derive(Serialize)]
struct ModelEntry<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: &'a str,
    parent: Option<&'a str>,
}

impl<'a> ModelEntry<'a> {
    /// The entry of `id`, served by the pods of `root` (itself for a base model).
    fn new(id: &'a str, root: &'a str) -> Self {
        ModelEntry {
            id,
            object: "model",
            created: 0,
            owned_by: "infergate",
            root,
            parent: (id != root).then_some(root),
        }
    }
}

fn endpoint_headers(addrs: &[SocketAddr]) -> HashMap<SocketAddr, EndpointHeaders> {
    addrs
        .iter()
        .filter_map(|a| {
            let header = HeaderValue::try_from(a.to_string()).ok()?;
            Some((*a, EndpointHeaders { header }))
        })
        .collect()
}

/// The flow controller of model `m` when `flowControl.enabled`: the previous one when the pool
/// is the same and neither `flowControl:` nor `tenancy:` changed (its queue is kept), else a new
/// one woken by the pool's releases and metrics pages.
fn flow_controller(
    config: &GatewayConfig,
    previous: Option<&State>,
    m: &crate::config::ModelConfig,
    backend: &Backend,
    tenancy: &infergate_pool::tenant::Tenancy,
    telemetry: &Telemetry,
) -> Option<infergate_pool::flow::FlowController> {
    if !config.flow_control.enabled {
        return None;
    }
    let kept = previous
        .filter(|p| {
            p.config.flow_control == config.flow_control && p.config.tenancy == config.tenancy
        })
        .and_then(|p| p.router.targets().iter().find(|t| *t.name == *m.name))
        .filter(|old| old.backend.pool.same_pool(&backend.pool))
        .and_then(|old| old.flow.clone());
    if kept.is_some() {
        return kept;
    }
    let flow = infergate_pool::flow::FlowController::new(
        &m.name,
        config.flow_control,
        tenancy.clone(),
        backend.pool.clock(),
        &telemetry.flow,
    );
    flow.watch(backend.pool.changes());
    Some(flow)
}

/// Starts the `quotas:` service (validated with the configuration).
fn start_quotas(
    spec: &infergate_pool::quota::QuotasSpec,
) -> Result<infergate_pool::quota::Quotas, Error> {
    let invalid = |e: String| {
        Error::Config(crate::error::ConfigError::Invalid {
            source: <serde_yaml::Error as serde::de::Error>::custom(e),
        })
    };
    let config = spec.to_config().map_err(invalid)?;
    infergate_pool::quota::Quotas::start_with_registry(config)
        .map_err(|e| invalid(format!("`quotas`: {e}")))
}

/// The `/v1/models` body: the served names (models and adapters) `visible` accepts, called with
/// each name and its base model.
fn model_list<T>(router: &ModelRouter<T>, visible: impl Fn(&str, &str) -> bool) -> Bytes {
    let list = ModelList {
        object: "list",
        data: router
            .models()
            .into_iter()
            .filter(|(id, root)| visible(id, root))
            .map(|(id, root)| ModelEntry::new(id, root))
            .collect(),
    };
    Bytes::from(serde_json::to_vec(&list).unwrap_or_default())
}

impl State {
    /// The `/v1/models` answer for a caller with `access`: the prebuilt list when it may call
    /// every model (no allocation), else the models and adapters it may call, built per request.
    pub(crate) fn models_for(&self, access: &ModelAccess) -> Bytes {
        match access {
            ModelAccess::All => self.models_body.clone(),
            only => model_list(&self.router, |id, root| only.allows(id, root)),
        }
    }

    /// The `/v1/models/{id}` answer for a caller with `access`: the model's entry, as in the list;
    /// a name that is not served, or that this caller may not call, is 404 listing what it may
    /// call (as for a request naming it).
    pub(crate) fn model_for(
        &self,
        access: &ModelAccess,
        id: &str,
    ) -> Result<Bytes, infergate_openai::ApiError> {
        let allowed = |name: &str, root: &str| access.allows(name, root);
        let Some((id, root)) = self
            .router
            .models()
            .into_iter()
            .find(|(name, root)| *name == id && allowed(name, root))
        else {
            return Err(self.router.unknown_to(id, allowed).for_retrieve());
        };
        let entry = ModelEntry::new(id, root);
        Ok(Bytes::from(serde_json::to_vec(&entry).unwrap_or_default()))
    }

    /// Builds the state for `config`, carrying over what `previous` can share.
    pub(crate) fn build(
        config: GatewayConfig,
        previous: Option<&State>,
        telemetry: &Telemetry,
    ) -> Result<State, Error> {
        // Validated with the configuration, so this cannot fail.
        let tenancy = infergate_pool::tenant::Tenancy::new(&config.tenancy).map_err(|e| {
            Error::Config(crate::error::ConfigError::Invalid {
                source: <serde_yaml::Error as serde::de::Error>::custom(e),
            })
        })?;
        let mut router = ModelRouter::new();
        for (i, m) in config.models.iter().enumerate() {
            let reused = previous
                .and_then(|p| p.router.targets().iter().find(|t| *t.name == *m.name))
                .filter(|old| old.backend.reusable_for(m, &config.scrape));
            let backend = match reused {
                Some(old) => {
                    old.backend.set_endpoints(m)?;
                    old.backend.clone()
                }
                None => Backend::start(m, &config.scrape, config.seed.wrapping_add(i as u64))?,
            };
            let addrs: Vec<SocketAddr> = m.endpoints.iter().map(|e| e.address).collect();
            let concurrency = config.max_concurrent_requests(m).map(|max| {
                let active = previous
                    .and_then(|p| p.router.targets().iter().find(|t| *t.name == *m.name))
                    .and_then(|old| old.slots.concurrency())
                    .map_or_else(|| Arc::new(AtomicUsize::new(0)), |c| Arc::clone(&c.active));
                Concurrency {
                    active,
                    max: usize::try_from(max).unwrap_or(usize::MAX),
                    freed: config.flow_control.enabled.then(|| backend.pool.changes()),
                }
            });
            let flow = flow_controller(&config, previous, m, &backend, &tenancy, telemetry);
            let slots = match concurrency {
                None => Slots::Unlimited,
                Some(c) if flow.is_some() => Slots::AtDispatch(Gated {
                    pool: backend.pool.clone(),
                    slots: c,
                }),
                Some(c) => Slots::BeforePick(c),
            };
            let model = Arc::new(Model {
                name: m.name.as_str().into(),
                flow,
                backend,
                metrics: telemetry.model(&m.name, &addrs),
                endpoints: endpoint_headers(&addrs),
                slots,
            });
            // The configuration was validated with the same table, so this cannot clash.
            router
                .add_model(&m.name, &m.lora_adapters, model)
                .map_err(|e| {
                    Error::Config(crate::error::ConfigError::Invalid {
                        source: <serde_yaml::Error as serde::de::Error>::custom(e),
                    })
                })?;
        }
        let models_body = model_list(&router, |_, _| true);
        let auth = match previous.filter(|p| p.auth.serves(&config.auth)) {
            Some(p) => Arc::clone(&p.auth),
            None => Arc::new(Authenticator::new(&config.auth)?),
        };
        // Validated with the configuration, so this cannot fail.
        let rewrites = Rewrites::new(&config.rewrites).map_err(|e| {
            Error::Config(crate::error::ConfigError::Invalid {
                source: <serde_yaml::Error as serde::de::Error>::custom(e),
            })
        })?;
        let quotas = match (&config.quotas, previous) {
            (None, _) => None,
            (Some(spec), Some(p)) if p.config.quotas.as_ref() == Some(spec) => p.quotas.clone(),
            (Some(spec), _) => Some(start_quotas(spec)?),
        };
        let retired_flows = previous.map_or_else(Vec::new, |p| p.retired_flows(&router));
        let access_log = AccessLog::reloaded(
            config.access_log.as_ref(),
            previous.and_then(|p| p.access_log.as_ref()),
            &telemetry.access_log,
        )?;
        Ok(State {
            config,
            router,
            models_body,
            auth,
            rewrites,
            quotas,
            tenancy,
            retired_flows,
            access_log,
        })
    }

    /// This state's flow controllers and those it had retired, still alive, that `router` (the
    /// next state's) does not keep.
    fn retired_flows(&self, router: &ModelRouter<Arc<Model>>) -> Vec<WeakFlowController> {
        let kept = |f: &FlowController| {
            router
                .targets()
                .iter()
                .filter_map(|m| m.flow.as_ref())
                .any(|k| k.is(f))
        };
        self.queues()
            .filter(|f| !kept(f))
            .map(|f| f.downgrade())
            .collect()
    }

    /// Every flow controller that may hold queued requests: the models' own, then those
    /// reloads replaced while requests still wait in them.
    pub(crate) fn queues(&self) -> impl Iterator<Item = FlowController> + '_ {
        self.router
            .targets()
            .iter()
            .filter_map(|m| m.flow.clone())
            .chain(
                self.retired_flows
                    .iter()
                    .filter_map(WeakFlowController::upgrade),
            )
    }

    /// Whether every model has an endpoint with fresh metrics, and some request can be
    /// authenticated (not so while JWTs are the only credential and no key set was fetched).
    pub(crate) fn is_ready(&self) -> bool {
        self.readiness().is_ready()
    }

    /// As [`State::is_ready`], with each model that cannot route and why, and the missing key
    /// set: what `/readyz` answers.
    pub(crate) fn readiness(&self) -> infergate_pool::readiness::Readiness {
        use infergate_pool::readiness::{NotReady, Readiness};
        let mut readiness = Readiness::ready();
        for m in self.router.targets() {
            if let Some(reason) = m.backend.pool.not_ready() {
                readiness.push(NotReady::Model {
                    name: m.name.to_string(),
                    reason,
                });
            }
        }
        if !self.auth.is_ready() {
            readiness.push(NotReady::JwksNotFetched);
        }
        readiness
    }
}
