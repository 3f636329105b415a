//! The controller: `reconcile` and `error_policy` in the shape of kube-rs's controller-rs.
//!
//! One reconcile: add the finalizer (first time), validate and render, list the config's
//! children by [`CONFIG_LABEL`], server-side apply each desired child that differs from what is
//! there, delete owned children that left the spec, then write the status if it changed. A
//! config whose children and status already match causes reads only (lists, the Secrets the
//! spec names and the peer-exchange keys), no writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt};
use infergate_api::{InferenceGatewayConfig, InferenceGatewayConfigStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use ring::rand::{SecureRandom, SystemRandom};
use serde_json::{Value, json};
use tracing::{debug, info, instrument, warn};

use crate::Error;
use crate::metrics::Metrics;
use crate::render::{
    CONFIG_LABEL, Child, MANAGED_BY, PEER_KEY_FILE, RenderOptions, child_kinds, peer_key_secrets,
    render,
};
use crate::scope::{WatchScope, api_in, where_};
use crate::status::{self, ModelServers, Observed};
use crate::triggers::PodIndex;

/// The one field manager every write uses.
pub const FIELD_MANAGER: &str = "infergate-operator";
/// Finalizer that deletes the children before the config goes away.
pub const FINALIZER: &str = "infergate.dev/cleanup";
/// Requeue while the gateway is not ready yet (what the status reads is watched as well, see
/// [`run`]; this catches what a watch missed).
pub const REQUEUE_NOT_READY: Duration = Duration::from_secs(15);
/// Requeue of a ready config, to catch drift nothing watched reported.
pub const REQUEUE_READY: Duration = Duration::from_secs(300);
/// First retry delay after a failure; doubles per consecutive failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest retry delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Attempts of one apply when the API server answers 409 Conflict.
pub const CONFLICT_ATTEMPTS: u32 = 3;

/// Shared state of the reconciler.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Render settings.
    pub opts: RenderOptions,
    /// Counters.
    pub metrics: Metrics,
    /// Consecutive failures per `namespace/name`, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// `reportingInstance` of the Events (the pod's name, which Kubernetes sets as `HOSTNAME`).
    instance: String,
    /// The clock (a function so tests can pin it).
    now: fn() -> Time,
}

impl Context {
    /// A context with the system clock.
    pub fn new(client: Client, opts: RenderOptions, metrics: Metrics) -> Self {
        Self {
            instance: std::env::var("HOSTNAME").unwrap_or_else(|_| FIELD_MANAGER.to_owned()),
            client,
            opts,
            metrics,
            failures: Mutex::new(HashMap::new()),
            now: || Time(k8s_openapi::jiff::Timestamp::now()),
        }
    }

    /// Replaces the clock.
    pub fn with_clock(mut self, now: fn() -> Time) -> Self {
        self.now = now;
        self
    }

    fn failure_count(&self, key: &str, bump: bool) -> u32 {
        let mut map = match self.failures.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        if bump {
            let n = map.entry(key.to_owned()).or_insert(0);
            *n += 1;
            *n
        } else {
            map.remove(key);
            0
        }
    }
}

fn key(cfg: &InferenceGatewayConfig) -> String {
    format!("{}/{}", cfg.namespace().unwrap_or_default(), cfg.name_any())
}

/// Reconciles one config.
#[instrument(skip_all, fields(config = %key(&cfg)))]
pub async fn reconcile(
    cfg: Arc<InferenceGatewayConfig>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.metrics.reconciliations.inc();
    let ns = cfg.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let api: Api<InferenceGatewayConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let k = key(&cfg);
    let action = finalizer(&api, FINALIZER, cfg, |event| async {
        match event {
            Event::Apply(cfg) => apply(&cfg, &ctx, &api).await,
            Event::Cleanup(cfg) => cleanup(&cfg, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    })?;
    ctx.failure_count(&k, false);
    Ok(action)
}

/// Backs off exponentially per config and counts the failure.
pub fn error_policy(cfg: Arc<InferenceGatewayConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(error);
    let n = ctx.failure_count(&key(&cfg), true);
    let delay = BACKOFF_BASE
        .saturating_mul(1u32 << (n.saturating_sub(1)).min(16))
        .min(BACKOFF_MAX);
    warn!(config = %key(&cfg), error = %error.report(), kind = error.metric_label(), attempt = n, ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn apply(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    api: &Api<InferenceGatewayConfig>,
) -> Result<Action, Error> {
    let now = (ctx.now)();
    let desired = match render(cfg, &ctx.opts) {
        Ok(d) => d,
        Err(
            e @ (Error::Invalid(_)
            | Error::NameTooLong { .. }
            | Error::SchedulerConfig(_)
            | Error::PickerFile { .. }),
        ) => {
            // A spec problem: say so in the status and wait for the user to change it.
            let st = status::rejected(cfg, &e.to_string(), &now);
            write_status(cfg, ctx, api, st).await?;
            return Ok(Action::await_change());
        }
        Err(e) => return Err(e),
    };
    match converge(cfg, ctx, api, &desired, &now).await {
        Ok(action) => Ok(action),
        Err(e) => {
            // The spec is fine but the cluster did not take it: say why where `kubectl get`
            // and `describe` look, then back off. The status write is best effort: the
            // error that matters is `e`.
            let st = status::failed(cfg, failure_reason(&e), &e.report(), desired.len(), &now);
            if let Err(status_err) = write_status(cfg, ctx, api, st).await {
                debug!(error = %status_err.report(), "cannot report the failure in the status");
            }
            Err(e)
        }
    }
}

/// The `Ready` condition's reason for a reconcile that failed after the spec was accepted.
fn failure_reason(e: &Error) -> &'static str {
    match e {
        Error::MissingApi { .. } => "MissingAPI",
        Error::Child { .. } => "ApplyFailed",
        Error::NameTaken { .. } => "NameTaken",
        _ => "ReconcileError",
    }
}

/// The children whose `status.ancestors` say whether Envoy Gateway attached them.
const POLICY_KINDS: [&str; 3] = [
    "EnvoyExtensionPolicy",
    "SecurityPolicy",
    "ClientTrafficPolicy",
];

/// Makes the cluster hold `desired` and writes the status of what it saw.
async fn converge(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    api: &Api<InferenceGatewayConfig>,
    desired: &[Child],
    now: &Time,
) -> Result<Action, Error> {
    ensure_peer_keys(cfg, ctx).await?;
    let existing = list_children(cfg, ctx, MissingApi::Fail).await?;
    let mut writes = 0usize;
    for child in desired {
        let current = existing.get(&(child.resource.kind.clone(), child.object.name_any()));
        if current.is_some_and(|cur| up_to_date(&child.object, cur)) {
            continue;
        }
        if current.is_none() {
            ensure_name_free(cfg, ctx, child).await?;
        }
        apply_child(ctx, child).await?;
        writes += 1;
    }
    let uid = cfg.uid().unwrap_or_default();
    let mut pruned = 0usize;
    for ((kind, name), obj) in &existing {
        if desired
            .iter()
            .any(|c| &c.resource.kind == kind && &c.object.name_any() == name)
            || !owned_by(obj, &uid)
        {
            continue;
        }
        delete_child(ctx, kind, obj).await?;
        pruned += 1;
    }
    let unusable_secrets = unusable_secrets(cfg, ctx).await?;
    let model_servers = model_servers(cfg, ctx).await?;
    let observed = Observed {
        unusable_secrets,
        model_servers,
        routes: existing
            .iter()
            .filter(|((k, _), _)| k == "HTTPRoute")
            .filter_map(|(_, o)| serde_json::to_value(o).ok())
            .collect(),
        policies: existing
            .iter()
            .filter(|((k, _), _)| POLICY_KINDS.contains(&k.as_str()))
            .filter_map(|((k, _), o)| {
                let mut v = serde_json::to_value(o).ok()?;
                // Items of a list may come without their kind; the status names it.
                v["kind"] = Value::from(k.as_str());
                Some(v)
            })
            .collect(),
        gateway: existing
            .iter()
            .find(|((k, _), _)| k == "Gateway")
            .and_then(|(_, o)| serde_json::to_value(o).ok()),
        deployments: existing
            .iter()
            .filter(|((k, _), _)| k == "Deployment")
            .filter_map(|(_, o)| {
                serde_json::to_value(o)
                    .ok()
                    .and_then(|v| serde_json::from_value::<Deployment>(v).ok())
            })
            .collect(),
    };
    let st = status::accepted(cfg, &observed, desired.len(), now);
    let ready = st
        .conditions
        .iter()
        .any(|c| c.type_ == infergate_api::status::READY && c.status == "True");
    write_status(cfg, ctx, api, st).await?;
    info!(
        children = desired.len(),
        writes, pruned, ready, "reconciled"
    );
    Ok(Action::requeue(if ready {
        REQUEUE_READY
    } else {
        REQUEUE_NOT_READY
    }))
}

/// The pods each scheduler's `modelSelector` matches in the config's namespace, and how many
/// are ready: a selector that matches nothing (a typo, model servers in another namespace)
/// leaves every request of its models without an endpoint while every child looks healthy.
/// [`run`] watches the pods, so a pass follows each change of a matching one.
async fn model_servers(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
) -> Result<BTreeMap<String, ModelServers>, Error> {
    let ns = cfg.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut out = BTreeMap::new();
    for s in &cfg.spec.schedulers {
        let selector = status::selector_text(&s.model_selector);
        let pods = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| Error::Child {
                action: "list",
                child: format!(
                    "Pods in {ns} matching modelSelector {selector} (scheduler {})",
                    s.name
                ),
                source: Box::new(source),
            })?;
        let mut servers = ModelServers::default();
        for pod in pods
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            servers.matching += 1;
            let ready = pod
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            servers.ready += usize::from(ready);
        }
        out.insert(s.name.clone(), servers);
    }
    Ok(out)
}

/// The Secrets the spec names (the Gateway's certificate, the Redis password) that do not
/// exist or lack the key: each as a sentence naming the Secret and the field. Without them
/// the pickers' pods wait in `CreateContainerConfigError` and the Gateway refuses its HTTPS
/// listeners, which the Deployment and the Gateway report only vaguely or late.
async fn unusable_secrets(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
) -> Result<Vec<String>, Error> {
    let ns = cfg.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let mut refs: Vec<(&str, Option<&str>, &str)> = Vec::new();
    if let Some(r) = cfg
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.certificate_secret_ref.as_ref())
    {
        refs.push((&r.name, None, "spec.tls.certificateSecretRef"));
    }
    if let Some(r) = cfg
        .spec
        .quotas
        .as_ref()
        .and_then(|q| q.redis.as_ref())
        .and_then(|r| r.password_secret_ref.as_ref())
    {
        refs.push((&r.name, Some(&r.key), "spec.quotas.redis.passwordSecretRef"));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut out = Vec::new();
    for (name, key, field) in refs {
        let secret = api.get_opt(name).await.map_err(|source| Error::Child {
            action: "read",
            child: format!("Secret {ns}/{name} ({field})"),
            source: Box::new(source),
        })?;
        match (secret, key) {
            (None, _) => out.push(format!("Secret {ns}/{name} ({field}) does not exist")),
            (Some(s), Some(key)) if !s.data.as_ref().is_some_and(|d| d.contains_key(key)) => {
                out.push(format!("Secret {ns}/{name} ({field}) has no key `{key}`"));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Creates the peer-exchange key Secret of every scheduler with several picker replicas when
/// it is missing: 32 random bytes, hex. One that exists is left as it is, whoever made it. It is
/// owned by the config, so it goes with it; it is created before the Deployment that mounts it.
async fn ensure_peer_keys(cfg: &InferenceGatewayConfig, ctx: &Context) -> Result<(), Error> {
    let secrets = peer_key_secrets(cfg, &ctx.opts)?;
    if secrets.is_empty() {
        return Ok(());
    }
    let rng = SystemRandom::new();
    for mut secret in secrets {
        let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        if read_secret(&api, &ns, &name).await?.is_some() {
            continue;
        }
        let mut key = [0u8; 32];
        rng.fill(&mut key).map_err(|_| Error::Random)?;
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        secret.string_data = Some(BTreeMap::from([(PEER_KEY_FILE.to_owned(), hex)]));
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => info!(secret = %name, "created the pickers' peer-exchange key"),
            // Created meanwhile (another reconcile, or by hand): keep that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(source) => {
                return Err(Error::Child {
                    action: "create",
                    child: format!("Secret {ns}/{name}"),
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(())
}

async fn read_secret(api: &Api<Secret>, ns: &str, name: &str) -> Result<Option<Secret>, Error> {
    api.get_opt(name).await.map_err(|source| Error::Child {
        action: "read",
        child: format!("Secret {ns}/{name}"),
        source: Box::new(source),
    })
}

/// Deletes the peer-exchange key Secrets this config created (owned by it; one made by hand is
/// left).
async fn delete_peer_keys(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    uid: &str,
) -> Result<(), Error> {
    for secret in peer_key_secrets(cfg, &ctx.opts).unwrap_or_default() {
        let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        let Some(current) = read_secret(&api, &ns, &name).await? else {
            continue;
        };
        let ours = current
            .owner_references()
            .iter()
            .any(|o| o.uid == uid && o.controller == Some(true));
        if ours {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    return Err(Error::Child {
                        action: "delete",
                        child: format!("Secret {ns}/{name}"),
                        source: Box::new(source),
                    });
                }
            }
        }
    }
    Ok(())
}

async fn cleanup(cfg: &InferenceGatewayConfig, ctx: &Context) -> Result<Action, Error> {
    // Owner references would let the garbage collector do this too; deleting explicitly makes
    // removal immediate and independent of the collector's foreground/background choice.
    let uid = cfg.uid().unwrap_or_default();
    // An upstream API removed before the config (Envoy Gateway or the Inference Extension
    // uninstalled first) holds no children to delete: the finalizer must not stick on it.
    let existing = list_children(cfg, ctx, MissingApi::Skip).await?;
    for ((kind, _), obj) in &existing {
        if owned_by(obj, &uid) {
            delete_child(ctx, kind, obj).await?;
        }
    }
    delete_peer_keys(cfg, ctx, &uid).await?;
    info!(deleted = existing.len(), "cleaned up");
    Ok(Action::await_change())
}

type Existing = BTreeMap<(String, String), DynamicObject>;

/// What listing children does when the cluster does not serve one of the child kinds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MissingApi {
    /// Fail with [`Error::MissingApi`]: the children cannot be applied.
    Fail,
    /// Treat the kind as having no objects (deletion: nothing of that kind can exist).
    Skip,
}

async fn list_children(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    missing: MissingApi,
) -> Result<Existing, Error> {
    let ns = cfg.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let lp = ListParams::default().labels(&format!("{CONFIG_LABEL}={}", cfg.name_any()));
    let mut out = BTreeMap::new();
    for ar in child_kinds() {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &ar);
        let list = match api.list(&lp).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if s.code == 404 && missing == MissingApi::Skip => {
                debug!(kind = %ar.kind, "API not served; no children of this kind");
                continue;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(Error::MissingApi {
                    kind: ar.kind.clone(),
                    api_version: ar.api_version.clone(),
                });
            }
            Err(source) => {
                return Err(Error::Child {
                    action: "list",
                    child: format!(
                        "{} objects labelled {CONFIG_LABEL}={} in {ns}",
                        ar.kind,
                        cfg.name_any()
                    ),
                    source: Box::new(source),
                });
            }
        };
        for obj in list {
            out.insert((ar.kind.clone(), obj.name_any()), obj);
        }
    }
    Ok(out)
}

/// Fails when a child missing from the config's labelled children exists all the same: an
/// object of someone else's with that name, which a forced apply would take over.
async fn ensure_name_free(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    child: &Child,
) -> Result<(), Error> {
    let ns = child.object.namespace().unwrap_or_default();
    let name = child.object.name_any();
    let what = format!("{} {ns}/{name}", child.resource.kind);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &child.resource);
    match api.get_opt(&name).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(Error::NameTaken {
            child: what,
            config: cfg.name_any(),
        }),
        Err(source) => Err(Error::Child {
            action: "read",
            child: what,
            source: Box::new(source),
        }),
    }
}

async fn apply_child(ctx: &Context, child: &Child) -> Result<(), Error> {
    let ns = child.object.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &child.resource);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let mut attempt = 1;
    loop {
        match api
            .patch(&child.object.name_any(), &pp, &Patch::Apply(&child.object))
            .await
        {
            Ok(_) => {
                debug!(child = %child.key(), "applied");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_ATTEMPTS => {
                debug!(child = %child.key(), attempt, "conflict, retrying");
                attempt += 1;
            }
            Err(source) => {
                return Err(Error::Child {
                    action: "apply",
                    child: format!("{} {ns}/{}", child.resource.kind, child.object.name_any()),
                    source: Box::new(source),
                });
            }
        }
    }
}

async fn delete_child(ctx: &Context, kind: &str, obj: &DynamicObject) -> Result<(), Error> {
    let Some(ar) = child_kinds().into_iter().find(|k| k.kind == kind) else {
        return Ok(());
    };
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &obj.namespace().unwrap_or_default(),
        &ar,
    );
    match api
        .delete(&obj.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => {
            debug!(child = %format!("{kind}/{}", obj.name_any()), "pruned");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Child {
            action: "delete",
            child: format!(
                "{kind} {}/{}",
                obj.namespace().unwrap_or_default(),
                obj.name_any()
            ),
            source: Box::new(source),
        }),
    }
}

/// Writes `st` when it differs from the config's status, and records an Event on the config
/// when its `Ready` condition changes (see [`ready_event`]). The Event is sent even when the
/// status write fails (the failure it reports may be why: the next attempt, seeing the old
/// status, sends it again), and its own failure is logged only.
async fn write_status(
    cfg: &InferenceGatewayConfig,
    ctx: &Context,
    api: &Api<InferenceGatewayConfig>,
    st: InferenceGatewayConfigStatus,
) -> Result<(), Error> {
    if cfg.status.as_ref() == Some(&st) {
        return Ok(());
    }
    let event = ready_event(cfg.status.as_ref(), &st);
    let patch = json!({
        "apiVersion": InferenceGatewayConfig::api_version(&()),
        "kind": InferenceGatewayConfig::kind(&()),
        "status": st,
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let written = api
        .patch_status(&cfg.name_any(), &pp, &Patch::Apply(&patch))
        .await;
    if let Some(event) = event {
        record(cfg, ctx, event).await;
    }
    written?;
    Ok(())
}

/// Creates `event` on the config, in its namespace (`kubectl describe` and `kubectl events`
/// show it). Each is a new Event: the notes of one reason differ (another error), and a
/// transition is rare enough that no series is needed.
async fn record(cfg: &InferenceGatewayConfig, ctx: &Context, event: ReadyEvent) {
    let Some(ns) = cfg.namespace() else {
        return;
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let object = KubeEvent {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", cfg.name_any(), now.as_nanosecond())),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(if event.warning { "Warning" } else { "Normal" }.to_owned()),
        reason: Some(event.reason.clone()),
        note: Some(event.note),
        action: Some("Reconcile".to_owned()),
        regarding: Some(cfg.object_ref(&())),
        reporting_controller: Some(FIELD_MANAGER.to_owned()),
        reporting_instance: Some(ctx.instance.clone()),
        ..KubeEvent::default()
    };
    let api: Api<KubeEvent> = Api::namespaced(ctx.client.clone(), &ns);
    if let Err(e) = api.create(&PostParams::default(), &object).await {
        warn!(config = %key(cfg), reason = %event.reason, error = %e, "cannot record the event");
    }
}

/// An Event to record on a config: what [`ready_event`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyEvent {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// The `Ready` condition's reason.
    pub reason: String,
    /// Its message, cut to the 1 kB an Event's note may hold.
    pub note: String,
}

/// The `Ready` reasons that are not a problem: the gateway serves, or its children are still
/// rolling out. Every other reason (`Invalid`, `MissingAPI`, `ApplyFailed`, `NameTaken`,
/// `SecretNotFound`, `RouteNotAccepted`, `PolicyNotAccepted`, `NoModelServers`, ...) is a
/// Warning.
const NORMAL_REASONS: [&str; 2] = ["Ready", "Pending"];

/// Longest Event note the API server takes (1 kB); longer messages are cut at a character.
const EVENT_NOTE_BYTES: usize = 1024;

/// The Event for a change of the `Ready` condition from `old` to `new`: a new status or reason,
/// or a Warning whose message changed (another error). `None` when nothing `kubectl describe`
/// should show happened, such as a rollout's progress within `Pending`.
pub fn ready_event(
    old: Option<&InferenceGatewayConfigStatus>,
    new: &InferenceGatewayConfigStatus,
) -> Option<ReadyEvent> {
    let ready = |s: &InferenceGatewayConfigStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == infergate_api::status::READY)
            .cloned()
    };
    let now = ready(new)?;
    let warning = !NORMAL_REASONS.contains(&now.reason.as_str());
    if let Some(before) = old.and_then(ready)
        && before.status == now.status
        && before.reason == now.reason
        && (!warning || before.message == now.message)
    {
        return None;
    }
    let mut note = now.message;
    if note.len() > EVENT_NOTE_BYTES {
        let mut end = EVENT_NOTE_BYTES - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    Some(ReadyEvent {
        warning,
        reason: now.reason,
        note,
    })
}

fn owned_by(obj: &DynamicObject, uid: &str) -> bool {
    obj.owner_references()
        .iter()
        .any(|o| o.uid == uid && o.controller == Some(true))
}

/// Whether `current` already carries every field of `desired` with the same value (the API
/// server adds defaults and status, which do not count as drift).
pub fn up_to_date(desired: &DynamicObject, current: &DynamicObject) -> bool {
    let m = &desired.metadata;
    let c = &current.metadata;
    let meta_ok = subset(&json!(m.labels), &json!(c.labels))
        && (m.annotations.is_none() || subset(&json!(m.annotations), &json!(c.annotations)))
        && subset(&json!(m.owner_references), &json!(c.owner_references));
    meta_ok && subset(&desired.data, &current.data)
}

fn subset(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| subset(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| subset(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => want == have,
    }
}

/// Checks, before the controller starts, that the cluster serves `InferenceGatewayConfig` and
/// lets this operator list it everywhere it works: across every namespace, or in each namespace
/// of `scope` (through its namespaced path only, as a Role there grants it). Without it the
/// controller's watch would fail over and over with nothing above debug level in the log, and
/// the operator would idle, ready. A namespace whose Role is missing is named, with the
/// permission.
pub async fn preflight(client: &Client, scope: &WatchScope) -> Result<(), Error> {
    for ns in scope.targets() {
        let configs: Api<InferenceGatewayConfig> = api_in(client, ns.as_deref());
        match configs.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(Error::MissingCrd),
            Err(kube::Error::Api(s)) if s.code == 403 && ns.is_some() => {
                return Err(Error::NamespaceForbidden {
                    namespace: ns.unwrap_or_default(),
                    source: Box::new(kube::Error::Api(s)),
                });
            }
            Err(source) => {
                return Err(Error::Child {
                    action: "list",
                    child: format!("InferenceGatewayConfigs {}", where_(ns.as_deref())),
                    source: Box::new(source),
                });
            }
        }
    }
    Ok(())
}

/// Runs the controller until `shutdown` resolves, over every namespace or over each namespace
/// of `scope`: one controller per namespace, each watching through that namespace's paths only
/// (not one controller fed by merged watch streams: each relist of a watch replaces a
/// controller's whole store of configs, so a relist in one namespace would drop the others').
///
/// Besides the configs it watches what their status depends on, so a change shows at once
/// rather than at the next timed requeue: the Deployments, Gateways, HTTPRoutes and Envoy
/// Gateway policies it owns (labelled `app.kubernetes.io/managed-by`, mapped through the owner
/// reference) and every Pod of the scope
/// (mapped through the schedulers' `modelSelector`s by a [`PodIndex`]). Pods are watched as
/// metadata only and nothing of them is stored but the matching pods' names: the status reads
/// what it needs itself, so an event is only a trigger. No label selector can scope the Pod
/// watch (the union of several selectors is not one). The Pod watch starts with the first
/// pass: without a config, no pod matters. Secrets are not watched: that would take `list` and
/// `watch` on every Secret of the cluster (RBAC cannot grant them for some Secrets only), more
/// than the operator's `get` of the ones it knows by name; a Secret's change shows on the next
/// timed pass.
pub async fn run(
    client: Client,
    ctx: Arc<Context>,
    scope: WatchScope,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let shutdown = shutdown.shared();
    let controllers = scope
        .targets()
        .into_iter()
        .map(|ns| run_in(client.clone(), ctx.clone(), ns, shutdown.clone()));
    futures_util::future::join_all(controllers).await;
}

/// One controller over the configs in `ns`, or across every namespace with `None`: the configs,
/// their owned children and the Pods all watched through that one path.
///
/// A list of namespaces gets one controller each rather than one controller fed by merged
/// watch streams: the store of configs a controller keeps is replaced whole by every relist of
/// its watch (kube's reflector swaps in the listed objects), so a relist in one namespace would
/// drop the configs of the others from a shared store, and the Pod index maps pods against it.
/// Each namespace has its own queue, store and Pod index; a config is in exactly one of them.
async fn run_in(
    client: Client,
    ctx: Arc<Context>,
    ns: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = ns.as_deref();
    let configs: Api<InferenceGatewayConfig> = api_in(&client, ns);
    let owned =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
    let controller = Controller::new(configs, watcher::Config::default());
    let store = controller.store();
    // Set by the first pass: kube starts reconciling only once its store of configs is listed.
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let pods = {
        let store = store.clone();
        let mut index = PodIndex::default();
        let scope = where_(ns);
        after_configs_listed(
            listed,
            watcher(
                api_in::<PartialObjectMeta<Pod>>(&client, ns),
                watcher::Config::default(),
            ),
        )
        .flat_map(move |event| {
            let refs = match event {
                Ok(event) => index.apply(event, &store.state()),
                Err(e) => {
                    warn!(error = %e, scope = %scope, "watching Pods failed; retrying");
                    HashSet::new()
                }
            };
            futures_util::stream::iter(refs)
        })
    };
    let scope = where_(ns);
    controller
        .owns(api_in::<Deployment>(&client, ns), owned.clone())
        .owns(
            api_in::<gateway_api::gateways::Gateway>(&client, ns),
            owned.clone(),
        )
        .owns(
            api_in::<gateway_api::httproutes::HttpRoute>(&client, ns),
            owned.clone(),
        )
        .owns(
            api_in::<infergate_api::upstream::EnvoyExtensionPolicy>(&client, ns),
            owned.clone(),
        )
        .owns(
            api_in::<infergate_api::upstream::SecurityPolicy>(&client, ns),
            owned.clone(),
        )
        .owns(
            api_in::<infergate_api::upstream::ClientTrafficPolicy>(&client, ns),
            owned,
        )
        .reconcile_on(pods)
        .graceful_shutdown_on(shutdown)
        .run(
            move |cfg, ctx| {
                listed_tx.send_replace(true);
                reconcile(cfg, ctx)
            },
            error_policy,
            ctx,
        )
        .for_each(|res| {
            let scope = scope.clone();
            async move {
                match res {
                    // A failed reconcile is logged by `error_policy`; an object gone meanwhile
                    // is expected.
                    Ok(_)
                    | Err(
                        kube::runtime::controller::Error::ReconcilerFailed(..)
                        | kube::runtime::controller::Error::ObjectNotFound(_),
                    ) => {}
                    // A watch that fails (a CRD such as Gateway API's missing, a permission
                    // withdrawn) is retried with backoff; kube logs it at debug only.
                    Err(e) => warn!(
                        error = %e,
                        scope = %scope,
                        "watching InferenceGatewayConfigs or their Deployments, Gateways, HTTPRoutes and Envoy Gateway policies failed; retrying"
                    ),
                }
            }
        })
        .await;
}

/// `events`, started once `listed` is true (the configs are listed and one exists: a pod
/// mapped against no config would be missing from the [`PodIndex`]), with the watcher's backoff
/// between failed attempts. Not `Store::wait_until_ready`: in kube 4.2 its waiters share one
/// oneshot receiver that wakes only the last to poll, so a second waiter besides the
/// controller's own can leave one of them waiting for ever.
fn after_configs_listed<S, T>(
    mut listed: tokio::sync::watch::Receiver<bool>,
    events: S,
) -> impl futures_util::Stream<Item = Result<T, watcher::Error>> + Send + 'static
where
    S: futures_util::Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    futures_util::stream::once(async move {
        // The sender goes only with the controller, which then polls nothing any more.
        let _ = listed.wait_for(|l| *l).await;
        events.default_backoff()
    })
    .flatten()
}
