//! Pure render: one `InferenceGatewayConfig` in, every child object it implies out.
//!
//! No IO and no clock: the same config and options give byte-identical objects, which is what
//! the golden files under `tests/golden/` pin. Every child carries the label [`CONFIG_LABEL`]
//! naming its config, which is how the reconciler finds children to prune, and, when the config
//! has a uid (one the API server handed over), a controller owner reference to it. Objects are built as JSON and deserialised into their typed form
//! (k8s-openapi, gateway-api, `infergate_api::upstream`), so a misspelt field fails the render
//! tests instead of reaching the cluster.

use std::collections::BTreeMap;

use gateway_api::gateways::Gateway;
use gateway_api::httproutes::HttpRoute;
use infergate_api::upstream::{
    Authorization, AuthorizationRule, BackendRef, CircuitBreaker, ClaimMatch, ClaimToHeader,
    ClientTrafficPolicy, ClientTrafficPolicySpec, ClusterSettings, EndpointPickerRef,
    EnvoyExtensionPolicy, EnvoyExtensionPolicySpec, ExtProc, HeaderFilter, HeaderSettings,
    InferencePool, InferencePoolSpec, Jwt, JwtPrincipal, PoolSelector, PortNumber, Principal,
    ProcessingMode, ProcessingModeDirection, RemoteJwksRef, SecurityJwtProvider, SecurityPolicy,
    SecurityPolicySpec, TargetRef,
};
use infergate_api::{
    AuthSpec, InferenceGatewayConfig, InferenceGatewayConfigSpec, ListenerProtocol, SchedulerSpec,
    TlsSpec, validation,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use infergate_extproc::args::{self, BbrArgs, PickerArgs, command_line};
use infergate_extproc::bbr::ModelsFile;
use infergate_scheduler::{RewriteRule, Rewrites, SchedulerConfig, StaleMode};

use crate::Error;

/// Label on every child naming its `InferenceGatewayConfig`; the prune step selects on it.
pub const CONFIG_LABEL: &str = "infergate.dev/config";
/// Label on per-scheduler children naming the scheduler.
pub const SCHEDULER_LABEL: &str = "infergate.dev/scheduler";
/// Label on every child: which part of the gateway it is.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// `app.kubernetes.io/managed-by` value on every child.
pub const MANAGED_BY: &str = "infergate-operator";
/// Pod-template annotation holding a hash of the pod's ConfigMap, so a config change rolls pods.
pub const CONFIG_HASH_ANNOTATION: &str = "infergate.dev/config-hash";
/// Header the body-based router sets from the request's `model`.
pub const MODEL_HEADER: &str = "X-Gateway-Model-Name";
/// Header that carries the client's JWT to the Gateway (Envoy's default place for it, which the
/// rendered `SecurityPolicy` keeps); removed from requests on their way to the model servers.
pub const AUTHORIZATION_HEADER: &str = "Authorization";
/// Header the endpoint pickers read a request's tenant from (the reference's flow fairness id).
/// With `spec.auth`, the rendered `ClientTrafficPolicy` removes a client's own as Envoy receives
/// the request, and the `SecurityPolicy` writes it from the token's `tenantClaim` after the
/// check, so the pickers' quotas and fairness count the authenticated tenant.
pub const TENANT_HEADER: &str = infergate_pool::tenant::FAIRNESS_ID_HEADER;

/// Endpoint-picker ext_proc port (the picker's own default, so the rendered flag and the
/// binary agree).
pub const EPP_GRPC_PORT: i32 = args::PICKER_GRPC_PORT as i32;
/// Endpoint-picker gRPC health port.
pub const EPP_HEALTH_PORT: i32 = args::PICKER_HEALTH_PORT as i32;
/// Metrics port of the picker and the BBR.
pub const METRICS_PORT: i32 = args::METRICS_PORT as i32;
/// Body-based-router ext_proc port.
pub const BBR_GRPC_PORT: i32 = args::BBR_GRPC_PORT as i32;
/// The request body mode of the BBR's `EnvoyExtensionPolicy`: the body streams to the router
/// and back, so no Envoy buffer limits the prompts it routes (`spec.bbr.maxRequestBodyBytes`
/// does, at the router).
pub const BBR_BODY_MODE: &str = "FullDuplexStreamed";
/// Connections, parallel requests and pending requests Envoy may have to the BBR at once: Envoy
/// Gateway's schema maximum. Every request through the Gateway holds one ext_proc stream to
/// the BBR, and without a circuit breaker Envoy Gateway leaves Envoy's defaults of 1024, so
/// the 1025th concurrent request of an Envoy replica, whatever its model, failed with the
/// stream's overflow. How many requests run at once is for the pickers' queues to decide.
pub const BBR_CIRCUIT_BREAKER_LIMIT: u32 = u32::MAX;
/// Body-based-router gRPC health port.
pub const BBR_HEALTH_PORT: i32 = args::BBR_HEALTH_PORT as i32;
/// Folder the picker's and the BBR's ConfigMap is mounted at.
pub const CONFIG_MOUNT: &str = "/etc/infergate";
/// File name of the scheduler config in the picker's ConfigMap (read by `--config`).
pub const SCHEDULER_CONFIG_FILE: &str = "scheduler.yaml";
/// File name of the model map in the BBR's ConfigMap (read by `--models`).
pub const MODELS_CONFIG_FILE: &str = "models.yaml";
/// Path of the scheduler config inside the picker pod.
pub const SCHEDULER_CONFIG_PATH: &str = "/etc/infergate/scheduler.yaml";
/// File name of the model rewrites in the picker's ConfigMap (read by `--rewrites`).
pub const REWRITES_CONFIG_FILE: &str = "rewrites.yaml";
/// Path of the model rewrites inside the picker pod.
pub const REWRITES_CONFIG_PATH: &str = "/etc/infergate/rewrites.yaml";
/// File name of the per-tenant quotas in the picker's ConfigMap (read by `--quotas`).
pub const QUOTAS_CONFIG_FILE: &str = "quotas.yaml";
/// Path of the quotas inside the picker pod.
pub const QUOTAS_CONFIG_PATH: &str = "/etc/infergate/quotas.yaml";
/// File name of the flow-control settings in the picker's ConfigMap (read by `--flow-control`).
pub const FLOW_CONTROL_CONFIG_FILE: &str = "flow-control.yaml";
/// Path of the flow-control settings inside the picker pod.
pub const FLOW_CONTROL_CONFIG_PATH: &str = "/etc/infergate/flow-control.yaml";
/// The pickers' environment variable holding `spec.quotas.redis.passwordSecretRef`, which the
/// rendered quotas file names as its `passwordEnv`.
pub const REDIS_PASSWORD_ENV: &str = "INFERGATE_QUOTA_REDIS_PASSWORD";
/// Path of the model map inside the BBR pod.
pub const MODELS_CONFIG_PATH: &str = "/etc/infergate/models.yaml";
/// Folder the pickers' shared peer-exchange key is mounted at (from a Secret), when a scheduler
/// runs more than one replica.
pub const PEER_KEY_MOUNT: &str = "/etc/infergate-peer";
/// Where a picker with precise prefix routing finds the model's tokenizer files
/// (`spec.schedulers[*].precisePrefix.tokenizer`).
pub const TOKENIZER_MOUNT: &str = "/etc/infergate-tokenizer";
/// Key of the peer-exchange Secret holding the shared key, and its file name in the mount.
pub const PEER_KEY_FILE: &str = "key";
/// Path of the shared key inside the picker pod (`--peer-key-file`).
pub const PEER_KEY_PATH: &str = "/etc/infergate-peer/key";
/// Port of the pickers' peer exchange.
pub const PEER_PORT: i32 = args::PEER_PORT as i32;
/// Longest `terminationGracePeriodSeconds` of a picker pod: an hour, for a route or a queue
/// without a deadline.
pub const PICKER_GRACE_CAP_SECONDS: u64 = 3600;
/// Added to a picker's longest request for its own stop (the last answer's end, the exit).
pub const PICKER_GRACE_MARGIN_SECONDS: u64 = 30;
/// How long a stopping picker or BBR pod keeps serving before it is told to stop (a `preStop`
/// sleep), added to its grace period. Its endpoint's removal reaches Envoy a moment after the pod
/// is marked for deletion, and on SIGTERM the process stops accepting connections at once: the
/// ext_proc streams Envoy opened to it in between would fail, and with them the requests
/// (a picker's pool fails closed by default; the BBR's policy never fails open).
pub const PRE_STOP_SLEEP_SECONDS: u64 = 5;
/// Spreads a Deployment's replicas over nodes when it can (`ScheduleAnyway`): two replicas on
/// one node are one node drain or failure from no picker, whatever the PodDisruptionBudget says.
pub const SPREAD_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";
/// Label Envoy Gateway puts on the data-plane pods of a Gateway (its name).
pub const EG_OWNING_GATEWAY_NAME: &str = "gateway.envoyproxy.io/owning-gateway-name";
/// Label Envoy Gateway puts on the data-plane pods of a Gateway (its namespace).
pub const EG_OWNING_GATEWAY_NAMESPACE: &str = "gateway.envoyproxy.io/owning-gateway-namespace";
/// Label Envoy Gateway puts on the data-plane pods instead of the two above when its
/// `EnvoyProxy` merges the Gateways of a class (`mergeGateways: true`): one proxy serves every
/// Gateway of the GatewayClass it names.
pub const EG_OWNING_GATEWAY_CLASS: &str = "gateway.envoyproxy.io/owning-gatewayclass";

/// Settings of the operator process that shape every render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderOptions {
    /// Container image running `infergate picker` / `infergate bbr`.
    pub image: String,
    /// The containers' `imagePullPolicy`.
    pub image_pull_policy: PullPolicy,
    /// Secrets the kubelet pulls the image with (`imagePullSecrets`), by name: each must exist
    /// in the namespace of every config (a pod can name only Secrets of its own namespace).
    pub image_pull_secrets: Vec<String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/infergate/infergate:{}", env!("CARGO_PKG_VERSION")),
            image_pull_policy: PullPolicy::IfNotPresent,
            image_pull_secrets: Vec::new(),
        }
    }
}

/// A container's `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
#[clap(rename_all = "verbatim")]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the node does not have the image (Kubernetes' default for a tagged image).
    #[default]
    IfNotPresent,
    /// Never pull: the image must be on the node.
    Never,
}

/// The kinds a config can own, in apply order (RBAC and config before the pods that use them,
/// the pool before the route that points at it). The prune step lists each of these.
pub fn child_kinds() -> Vec<ApiResource> {
    vec![
        ApiResource::erase::<ServiceAccount>(&()),
        ApiResource::erase::<Role>(&()),
        ApiResource::erase::<RoleBinding>(&()),
        ApiResource::erase::<ConfigMap>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<PodDisruptionBudget>(&()),
        ApiResource::erase::<NetworkPolicy>(&()),
        ApiResource::erase::<Gateway>(&()),
        ApiResource::erase::<InferencePool>(&()),
        ApiResource::erase::<HttpRoute>(&()),
        ApiResource::erase::<EnvoyExtensionPolicy>(&()),
        ApiResource::erase::<SecurityPolicy>(&()),
        ApiResource::erase::<ClientTrafficPolicy>(&()),
    ]
}

/// One rendered child and the API it lives in.
#[derive(Debug, Clone)]
pub struct Child {
    /// Group, version, kind and plural.
    pub resource: ApiResource,
    /// The object, with metadata, ready to apply.
    pub object: DynamicObject,
}

impl Child {
    /// `Kind/name`, for logs and golden files.
    pub fn key(&self) -> String {
        format!("{}/{}", self.resource.kind, self.object.name_any())
    }
}

/// Renders every child of `cfg`. Fails on a config that breaks an admission rule.
pub fn render(cfg: &InferenceGatewayConfig, opts: &RenderOptions) -> Result<Vec<Child>, Error> {
    validation::validate(&cfg.spec)?;
    let r = Renderer::new(cfg, opts)?;
    let mut out = Vec::new();
    r.gateway(&mut out)?;
    if let Some(auth) = &cfg.spec.auth {
        r.security_policy(auth, &mut out)?;
    }
    if cfg.spec.bbr.enabled {
        r.bbr(&mut out)?;
    }
    for s in &cfg.spec.schedulers {
        r.scheduler(s, &mut out)?;
    }
    let order = child_kinds();
    out.sort_by_key(|c| {
        let rank = order.iter().position(|k| k.kind == c.resource.kind);
        (rank, c.object.name_any())
    });
    Ok(out)
}

/// Child names: `<config>` for the Gateway, `<config>-bbr`, `<config>-<scheduler>` for the
/// pool and route, `<config>-<scheduler>-epp` for the picker's objects.
pub fn scheduler_name(config: &str, scheduler: &str) -> String {
    format!("{config}-{scheduler}")
}

/// Name of a scheduler's endpoint-picker Deployment, Service and RBAC objects.
pub fn epp_name(config: &str, scheduler: &str) -> String {
    format!("{config}-{scheduler}-epp")
}

/// Name of the BBR Deployment and its objects.
pub fn bbr_name(config: &str) -> String {
    format!("{config}-bbr")
}

/// Name of the headless Service over a scheduler's picker pods, through which its replicas find
/// each other for the peer exchange.
pub fn peer_service_name(epp: &str) -> String {
    format!("{epp}-peers")
}

/// Name of the Secret holding the key a scheduler's picker replicas share for the peer
/// exchange. Not rendered (its key is random): the operator creates it once when it is missing
/// ([`peer_key_secrets`]); with `infergate render` it is created by hand (docs/operator.md).
pub fn peer_key_secret_name(epp: &str) -> String {
    format!("{epp}-peer-key")
}

/// The peer-exchange Secrets `cfg`'s pickers mount (one per scheduler with more than one
/// replica), with their metadata and no data: the caller fills in a random key and creates
/// them if missing, never replacing one that exists.
pub fn peer_key_secrets(
    cfg: &InferenceGatewayConfig,
    opts: &RenderOptions,
) -> Result<Vec<Secret>, Error> {
    let r = Renderer::new(cfg, opts)?;
    cfg.spec
        .schedulers
        .iter()
        .filter(|s| s.replicas > 1)
        .map(|s| {
            let epp = epp_name(&r.name, &s.name);
            Ok(Secret {
                metadata: r.meta(
                    &peer_key_secret_name(&epp),
                    "endpoint-picker",
                    Some(&s.name),
                )?,
                type_: Some("Opaque".to_owned()),
                ..Secret::default()
            })
        })
        .collect()
}

struct Renderer<'a> {
    cfg: &'a InferenceGatewayConfig,
    opts: &'a RenderOptions,
    name: String,
    namespace: String,
    /// `None` for a config read from a file (`infergate render`): it has no uid yet, and a
    /// made-up owner would have the garbage collector delete what a user applies.
    owner: Option<OwnerReference>,
}

impl<'a> Renderer<'a> {
    fn new(cfg: &'a InferenceGatewayConfig, opts: &'a RenderOptions) -> Result<Self, Error> {
        let name = cfg
            .metadata
            .name
            .clone()
            .ok_or(Error::MissingMetadata("name"))?;
        let namespace = cfg
            .metadata
            .namespace
            .clone()
            .ok_or(Error::MissingMetadata("namespace"))?;
        let owner = cfg.controller_owner_ref(&());
        Ok(Self {
            cfg,
            opts,
            name,
            namespace,
            owner,
        })
    }

    fn meta(
        &self,
        name: &str,
        component: &str,
        scheduler: Option<&str>,
    ) -> Result<ObjectMeta, Error> {
        if name.len() > 63 {
            return Err(Error::NameTooLong {
                name: name.to_owned(),
            });
        }
        let mut labels = self.base_labels(component);
        if let Some(s) = scheduler {
            labels.insert(SCHEDULER_LABEL.to_owned(), s.to_owned());
        }
        Ok(ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(labels),
            owner_references: self.owner.clone().map(|o| vec![o]),
            ..ObjectMeta::default()
        })
    }

    fn base_labels(&self, component: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "infergate".to_owned()),
            ("app.kubernetes.io/instance".to_owned(), self.name.clone()),
            (COMPONENT_LABEL.to_owned(), component.to_owned()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                MANAGED_BY.to_owned(),
            ),
            (CONFIG_LABEL.to_owned(), self.name.clone()),
        ])
    }

    /// Labels selecting one component's pods (a subset of the pod labels, stable across
    /// versions because a Deployment's selector is immutable).
    fn selector(&self, component: &str, scheduler: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([
            (CONFIG_LABEL.to_owned(), self.name.clone()),
            (COMPONENT_LABEL.to_owned(), component.to_owned()),
        ]);
        if let Some(s) = scheduler {
            m.insert(SCHEDULER_LABEL.to_owned(), s.to_owned());
        }
        m
    }

    fn gateway(&self, out: &mut Vec<Child>) -> Result<(), Error> {
        let spec = &self.cfg.spec;
        let meta = self.meta(&self.name, "gateway", None)?;
        let mut annotations = BTreeMap::new();
        if let Some(TlsSpec {
            issuer_ref: Some(issuer),
            ..
        }) = &spec.tls
        {
            let key = match issuer.kind {
                infergate_api::IssuerKind::Issuer => "cert-manager.io/issuer",
                infergate_api::IssuerKind::ClusterIssuer => "cert-manager.io/cluster-issuer",
            };
            annotations.insert(key.to_owned(), issuer.name.clone());
        }
        let cert_secret = match &spec.tls {
            Some(TlsSpec {
                certificate_secret_ref: Some(s),
                ..
            }) => s.name.clone(),
            _ => format!("{}-tls", self.name),
        };
        let listeners: Vec<Value> = spec
            .gateway
            .listeners
            .iter()
            .map(|l| {
                let mut v = json!({
                    "name": l.name,
                    "port": l.port,
                    "protocol": match l.protocol {
                        ListenerProtocol::Http => "HTTP",
                        ListenerProtocol::Https => "HTTPS",
                    },
                    "allowedRoutes": { "namespaces": { "from": "Same" } },
                });
                if let Some(h) = &l.hostname {
                    v["hostname"] = json!(h);
                }
                if l.protocol == ListenerProtocol::Https {
                    v["tls"] = json!({
                        "mode": "Terminate",
                        "certificateRefs": [{ "group": "", "kind": "Secret", "name": cert_secret }],
                    });
                }
                v
            })
            .collect();
        let mut meta = meta;
        if !annotations.is_empty() {
            meta.annotations = Some(annotations);
        }
        let gw: Gateway = typed(
            "Gateway",
            json!({
                "metadata": meta,
                "spec": { "gatewayClassName": spec.gateway.class_name, "listeners": listeners },
            }),
        )?;
        out.push(child(&gw)?);
        Ok(())
    }

    fn security_policy(&self, auth: &AuthSpec, out: &mut Vec<Child>) -> Result<(), Error> {
        let p = &auth.jwt.provider;
        let authorization = (!p.required_claims.is_empty()).then(|| Authorization {
            default_action: "Deny".to_owned(),
            rules: vec![AuthorizationRule {
                name: "required-claims".to_owned(),
                action: "Allow".to_owned(),
                principal: Principal {
                    jwt: JwtPrincipal {
                        provider: p.name.clone(),
                        claims: p
                            .required_claims
                            .iter()
                            .map(|c| ClaimMatch {
                                name: c.name.clone(),
                                values: c.values.clone(),
                            })
                            .collect(),
                    },
                },
            }],
        });
        let mut sp = SecurityPolicy::new(
            &format!("{}-auth", self.name),
            SecurityPolicySpec {
                target_refs: vec![TargetRef::gateway_api("Gateway", &self.name)],
                jwt: Some(Jwt {
                    providers: vec![SecurityJwtProvider {
                        name: p.name.clone(),
                        issuer: Some(p.issuer.clone()),
                        audiences: p.audiences.clone(),
                        remote_jwks: RemoteJwksRef {
                            uri: p.remote_jwks.uri.clone(),
                        },
                        // Envoy appends the claim to the header (`addCopy`), so the
                        // ClientTrafficPolicy below removes a client's own first.
                        claim_to_headers: vec![ClaimToHeader {
                            header: TENANT_HEADER.to_owned(),
                            claim: p.tenant_claim.clone(),
                        }],
                    }],
                }),
                authorization,
            },
        );
        sp.metadata = self.meta(&format!("{}-auth", self.name), "auth", None)?;
        out.push(child(&sp)?);
        // Removed as Envoy receives the request (the HTTP connection manager's early header
        // mutation), before the JWT filter writes the token's tenant and before the BBR and
        // the pickers read it.
        let name = format!("{}-client", self.name);
        let mut ctp = ClientTrafficPolicy::new(
            &name,
            ClientTrafficPolicySpec {
                target_refs: vec![TargetRef::gateway_api("Gateway", &self.name)],
                headers: Some(HeaderSettings {
                    early_request_headers: Some(HeaderFilter {
                        remove: vec![TENANT_HEADER.to_owned()],
                    }),
                }),
            },
        );
        ctp.metadata = self.meta(&name, "auth", None)?;
        out.push(child(&ctp)?);
        Ok(())
    }

    fn bbr(&self, out: &mut Vec<Child>) -> Result<(), Error> {
        let spec = &self.cfg.spec;
        let name = bbr_name(&self.name);
        let component = "bbr";
        // The model map, in the BBR's own file format: each served model and the LoRA
        // adapters that resolve to it.
        let models = ModelsFile {
            models: spec
                .schedulers
                .iter()
                .map(|s| {
                    let names = s.routed_names().into_iter().map(str::to_owned).collect();
                    (s.model_name.clone(), names)
                })
                .collect(),
        };
        let models_yaml = to_yaml(&models)?;
        let cm: ConfigMap = typed(
            "ConfigMap",
            json!({
                "metadata": self.meta(&name, component, None)?,
                "data": { MODELS_CONFIG_FILE: models_yaml },
            }),
        )?;
        let hash = fnv_hex(&models_yaml);
        out.push(child(&cm)?);
        out.push(child(&self.service_account(&name, component, None)?)?);
        let mut bbr = BbrArgs::new(MODELS_CONFIG_PATH);
        bbr.max_body_bytes = body_limit(spec.bbr.max_request_body_bytes)?;
        let ports = [
            ("grpc", i32::from(bbr.grpc_port)),
            ("health", i32::from(bbr.grpc_health_port)),
            ("metrics", i32::from(bbr.metrics_port)),
        ];
        let process = Process {
            args: command_line("bbr", &bbr).map_err(Error::CommandLine)?,
            ports: &ports,
            config_file: MODELS_CONFIG_FILE,
            extra_files: Vec::new(),
            env: Vec::new(),
            secret_mount: None,
            tokenizer: None,
            config_hash: &hash,
            // Envoy keeps a request's ext_proc stream to the router open until the filter is
            // destroyed, at the end of the answer, even though the router's part ends with the
            // request body (envoyproxy/envoy PR 41425 describes it and closes it early only in
            // some modes): a stopping router lets those streams end, as long as the longest
            // route's answer, as a picker does.
            grace_seconds: Some(self.bbr_grace_seconds()?),
        };
        out.push(child(&self.deployment(
            &name,
            component,
            None,
            spec.bbr.replicas,
            &process,
        )?)?);
        out.push(child(
            &self.network_policy(&name, component, None, &ports)?,
        )?);
        out.push(child(
            &self.service(&name, component, None, &ports, false)?,
        )?);
        out.push(child(&self.pdb(&name, component, None)?)?);
        let mut eep = EnvoyExtensionPolicy::new(
            &name,
            EnvoyExtensionPolicySpec {
                target_refs: vec![TargetRef::gateway_api("Gateway", &self.name)],
                ext_proc: vec![ExtProc {
                    backend_refs: vec![BackendRef::service(&name, BBR_GRPC_PORT)],
                    // The body streams to the router and back (Envoy Gateway sends the request
                    // trailers with it, as full duplex needs), as the reference BBR's own Envoy
                    // configuration has it. `Buffered` made Envoy hold the whole body in the
                    // listener's connection buffer first, 32 KiB on Envoy Gateway unless a
                    // ClientTrafficPolicy raises it, so every longer prompt was answered 413
                    // before the router saw it. The router answers once the body has ended; the
                    // timeout leaves room for a slow client's upload of a large body.
                    processing_mode: Some(ProcessingMode {
                        request: Some(ProcessingModeDirection {
                            body: Some(BBR_BODY_MODE.to_owned()),
                        }),
                        response: None,
                    }),
                    message_timeout: Some("30s".to_owned()),
                    fail_open: Some(false),
                    backend_settings: Some(ClusterSettings {
                        circuit_breaker: Some(CircuitBreaker {
                            max_connections: Some(BBR_CIRCUIT_BREAKER_LIMIT),
                            max_parallel_requests: Some(BBR_CIRCUIT_BREAKER_LIMIT),
                            max_pending_requests: Some(BBR_CIRCUIT_BREAKER_LIMIT),
                        }),
                    }),
                }],
            },
        );
        eep.metadata = self.meta(&name, component, None)?;
        out.push(child(&eep)?);
        Ok(())
    }

    fn scheduler(&self, s: &SchedulerSpec, out: &mut Vec<Child>) -> Result<(), Error> {
        let pool_name = scheduler_name(&self.name, &s.name);
        let epp = epp_name(&self.name, &s.name);
        let component = "endpoint-picker";
        let sched = Some(s.name.as_str());

        let mut pool = InferencePool::new(
            &pool_name,
            InferencePoolSpec {
                selector: PoolSelector {
                    match_labels: s.model_selector.clone(),
                },
                target_ports: vec![PortNumber {
                    number: s.target_port,
                }],
                app_protocol: Some(json_str(&s.app_protocol)),
                endpoint_picker_ref: EndpointPickerRef {
                    group: Some(String::new()),
                    kind: Some("Service".to_owned()),
                    name: epp.clone(),
                    port: Some(PortNumber {
                        number: EPP_GRPC_PORT,
                    }),
                    failure_mode: Some(json_str(&s.failure_mode)),
                },
            },
        );
        pool.metadata = self.meta(&pool_name, "inference-pool", sched)?;
        out.push(child(&pool)?);

        // What the picker runs with, in the picker's own file formats (`--config`,
        // `--quotas`, `--flow-control`).
        let scheduler_yaml = to_yaml(&scheduler_config(s)?)?;
        let quotas = quotas_yaml(&self.cfg.spec)?;
        let flow = flow_control_yaml(&self.cfg.spec)?;
        // The picker reads its quotas and flow-control files once, at start: they are in the
        // hash, so a change rolls the pods and each new pod starts with the new file.
        let mut hashed = scheduler_yaml.clone();
        for (file, text) in [
            (QUOTAS_CONFIG_FILE, &quotas),
            (FLOW_CONTROL_CONFIG_FILE, &flow),
        ] {
            if let Some(t) = text {
                hashed.push_str(&format!("\n--- {file}\n{t}"));
            }
        }
        let hash = fnv_hex(&hashed);
        let mut data = json!({ SCHEDULER_CONFIG_FILE: scheduler_yaml });
        // The rewrites are left out of the hash: the picker reloads the mounted file in place,
        // so a changed split rolls no pod and drops no request.
        let rewrites = rewrites_yaml(s)?;
        let mut extra_files = Vec::new();
        for (file, text) in [
            (REWRITES_CONFIG_FILE, &rewrites),
            (QUOTAS_CONFIG_FILE, &quotas),
            (FLOW_CONTROL_CONFIG_FILE, &flow),
        ] {
            if let Some(t) = text {
                data[file] = json!(t);
                extra_files.push(file);
            }
        }
        let cm: ConfigMap = typed(
            "ConfigMap",
            json!({
                "metadata": self.meta(&epp, component, sched)?,
                "data": data,
            }),
        )?;
        out.push(child(&cm)?);

        out.push(child(&self.service_account(&epp, component, sched)?)?);
        let role: Role = typed(
            "Role",
            json!({
                "metadata": self.meta(&epp, component, sched)?,
                "rules": [
                    { "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] },
                    {
                        "apiGroups": ["inference.networking.k8s.io"],
                        "resources": ["inferencepools"],
                        "verbs": ["get", "list", "watch"],
                    },
                ],
            }),
        )?;
        out.push(child(&role)?);
        let binding: RoleBinding = typed(
            "RoleBinding",
            json!({
                "metadata": self.meta(&epp, component, sched)?,
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp },
                "subjects": [{ "kind": "ServiceAccount", "name": epp, "namespace": self.namespace }],
            }),
        )?;
        out.push(child(&binding)?);

        let mut picker = PickerArgs::new(&pool_name, &self.namespace);
        picker.config = Some(SCHEDULER_CONFIG_PATH.into());
        if rewrites.is_some() {
            picker.rewrites = Some(REWRITES_CONFIG_PATH.into());
        }
        if quotas.is_some() {
            picker.quotas = Some(QUOTAS_CONFIG_PATH.into());
        }
        if flow.is_some() {
            picker.flow_control = Some(FLOW_CONTROL_CONFIG_PATH.into());
        }
        picker.default_engine = Some(s.engine_type.as_str().to_owned());
        // The body passes the BBR first: the picker must accept what the BBR accepted.
        picker.max_body_bytes = body_limit(self.cfg.spec.bbr.max_request_body_bytes)?;
        // Envoy AI Gateway connects to the picker over TLS and accepts any certificate (an empty
        // validation context), so the picker must serve TLS; a self-signed certificate generated
        // at start is enough and needs no Secret (docs/operator.md, "TLS").
        picker.tls_flags.tls_self_signed = true;
        // Active-active: two or more replicas exchange their in-flight load, finding each other
        // through a headless Service, authenticated by a key from a Secret (docs/operator.md).
        // The replica's name is the pod's (`POD_NAME`, set on every container).
        let peers = s.replicas > 1;
        if peers {
            picker.peer_key_file = Some(PEER_KEY_PATH.into());
            picker.peers = vec![format!(
                "{}.{}.svc:{PEER_PORT}",
                peer_service_name(&epp),
                self.namespace
            )];
        }
        // Precise prefix routing: the engines' KV events on their pods' ports, the tokenizer from
        // the user's ConfigMap or claim (read at start).
        let mut tokenizer = None;
        if let Some(pp) = &s.precise_prefix {
            let port = |p: i32, field: &'static str| {
                u16::try_from(p)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| Error::PickerFile {
                        field,
                        reason: "must be a port between 1 and 65535".into(),
                    })
            };
            picker.kv_events_port = Some(port(
                pp.events_port,
                "schedulers[].precisePrefix.eventsPort",
            )?);
            picker.kv_events_replay_port = pp
                .replay_port
                .map(|p| port(p, "schedulers[].precisePrefix.replayPort"))
                .transpose()?;
            picker.kv_events_topic = pp.topic.clone();
            picker.kv_index_bytes = pp.byte_budget.and_then(|b| u64::try_from(b).ok());
            picker.kv_max_body_bytes = pp.max_body_bytes.and_then(|b| usize::try_from(b).ok());
            picker.tokenizer = Some(TOKENIZER_MOUNT.into());
            let t = &pp.tokenizer;
            tokenizer = Some(match (&t.config_map, &t.persistent_volume_claim) {
                (Some(cm), None) => (json!({ "configMap": { "name": cm } }), None),
                (None, Some(claim)) => (
                    json!({ "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }),
                    t.sub_path.clone(),
                ),
                _ => {
                    return Err(Error::PickerFile {
                        field: "schedulers[].precisePrefix.tokenizer",
                        reason: infergate_api::validation::TOKENIZER_ONE_SOURCE
                            .message
                            .into(),
                    });
                }
            });
        }
        let mut ports = vec![
            ("grpc", i32::from(picker.grpc_port)),
            ("health", i32::from(picker.grpc_health_port)),
            ("metrics", i32::from(picker.metrics_port)),
        ];
        if peers {
            ports.push(("peer", PEER_PORT));
        }
        let process = Process {
            args: command_line("picker", &picker).map_err(Error::CommandLine)?,
            ports: &ports,
            config_file: SCHEDULER_CONFIG_FILE,
            extra_files,
            env: redis_password_env(&self.cfg.spec),
            secret_mount: peers.then(|| SecretMount {
                volume: "peer-key",
                secret: peer_key_secret_name(&epp),
                key: PEER_KEY_FILE,
                mount: PEER_KEY_MOUNT,
            }),
            tokenizer,
            config_hash: &hash,
            grace_seconds: Some(self.picker_grace_seconds(s)?),
        };
        out.push(child(
            &self.deployment(&epp, component, sched, s.replicas, &process)?,
        )?);
        out.push(child(
            &self.network_policy(&epp, component, sched, &ports)?,
        )?);
        let front: Vec<_> = ports
            .iter()
            .copied()
            .filter(|(n, _)| *n != "peer")
            .collect();
        out.push(child(&self.service(&epp, component, sched, &front, true)?)?);
        if peers {
            out.push(child(&self.peer_service(&epp, component, sched)?)?);
        }
        out.push(child(&self.pdb(&epp, component, sched)?)?);

        // Without the BBR there is one scheduler and nothing to choose: match every request.
        let matches: Vec<Value> = if self.cfg.spec.bbr.enabled {
            std::iter::once(s.model_name.as_str())
                .chain(s.routed_names())
                .map(|m| {
                    json!({
                        "path": { "type": "PathPrefix", "value": "/" },
                        "headers": [{ "type": "Exact", "name": MODEL_HEADER, "value": m }],
                    })
                })
                .collect()
        } else {
            vec![json!({ "path": { "type": "PathPrefix", "value": "/" } })]
        };
        let mut rule = json!({
            "matches": matches,
            "backendRefs": [{
                "group": "inference.networking.k8s.io",
                "kind": "InferencePool",
                "name": pool_name,
            }],
        });
        // Always set: without it Envoy's default route timeout (15 s to the end of the
        // response) cuts every longer streamed answer.
        rule["timeouts"] = json!({ "request": s.route_timeout() });
        // The client's token is the Gateway's credential, not the model servers'. Envoy Gateway
        // leaves it on the request after checking it (its JWT provider forwards the token), so
        // without this every model-server pod received every user's bearer token. Removed as
        // the request leaves for the pod: the JWT filter and the ext_proc servers, which run
        // before the router, still see it. Without `auth` the header is the client's own, e.g.
        // a model server's API key, and is passed on.
        if self.cfg.spec.auth.is_some() {
            rule["filters"] = json!([{
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": { "remove": [AUTHORIZATION_HEADER] },
            }]);
        }
        let route: HttpRoute = typed(
            "HTTPRoute",
            json!({
                "metadata": self.meta(&pool_name, "route", sched)?,
                "spec": {
                    "parentRefs": [{
                        "group": "gateway.networking.k8s.io",
                        "kind": "Gateway",
                        "name": self.name,
                    }],
                    "rules": [rule],
                },
            }),
        )?;
        out.push(child(&route)?);

        // No EnvoyExtensionPolicy for the picker: Envoy Gateway calls the pool's
        // `endpointPickerRef` itself for every route whose backend is an InferencePool
        // (docs/operator.md cites where), so a policy would make it call the picker twice.
        Ok(())
    }

    fn service_account(
        &self,
        name: &str,
        component: &str,
        sched: Option<&str>,
    ) -> Result<ServiceAccount, Error> {
        Ok(ServiceAccount {
            metadata: self.meta(name, component, sched)?,
            automount_service_account_token: Some(sched.is_some()),
            ..ServiceAccount::default()
        })
    }

    fn deployment(
        &self,
        name: &str,
        component: &str,
        sched: Option<&str>,
        replicas: i32,
        process: &Process<'_>,
    ) -> Result<Deployment, Error> {
        let pd = &self.cfg.spec.pod_defaults;
        let obs = &self.cfg.spec.observability;
        let mut labels = pd.labels.clone();
        labels.extend(self.base_labels(component));
        if let Some(s) = sched {
            labels.insert(SCHEDULER_LABEL.to_owned(), s.to_owned());
        }
        let mut annotations = pd.annotations.clone();
        annotations.insert(
            CONFIG_HASH_ANNOTATION.to_owned(),
            process.config_hash.to_owned(),
        );
        let port = |n: &str| process.ports.iter().find(|(p, _)| *p == n).map(|p| p.1);
        if obs.metrics
            && let Some(m) = port("metrics")
        {
            annotations.insert("prometheus.io/scrape".to_owned(), "true".to_owned());
            annotations.insert("prometheus.io/port".to_owned(), m.to_string());
            annotations.insert("prometheus.io/path".to_owned(), "/metrics".to_owned());
        }
        let env = container_env(
            vec![
                json!({ "name": "RUST_LOG", "value": json_str(&obs.log_level) }),
                json!({ "name": "INFERGATE_LOG_FORMAT", "value": json_str(&obs.log_format) }),
                json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }),
                json!({ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }),
            ],
            pd.env.iter().map(|e| json!(e)),
            process.env.iter().cloned(),
        );
        let mut container = json!({
            "name": component,
            "image": self.opts.image,
            "imagePullPolicy": self.opts.image_pull_policy,
            "args": process.args,
            "ports": process.ports.iter().map(|(n, p)| json!({ "name": n, "containerPort": p, "protocol": "TCP" })).collect::<Vec<_>>(),
            "env": env,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "capabilities": { "drop": ["ALL"] },
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "volumeMounts": [{ "name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true }],
            "resources": match &pd.resources {
                Some(r) => json!(r),
                None => default_resources(),
            },
        });
        if process.grace_seconds.is_some() {
            // The image's /bin/sleep (Debian's coreutils; Dockerfile).
            container["lifecycle"] = json!({
                "preStop": { "exec": { "command": ["/bin/sleep", PRE_STOP_SLEEP_SECONDS.to_string()] } },
            });
        }
        if let Some(h) = port("health") {
            container["readinessProbe"] =
                json!({ "grpc": { "port": h, "service": "readiness" }, "periodSeconds": 5 });
            container["livenessProbe"] =
                json!({ "grpc": { "port": h, "service": "liveness" }, "periodSeconds": 10 });
        }
        let file = process.config_file;
        let mut items = vec![json!({ "key": file, "path": file })];
        items.extend(
            process
                .extra_files
                .iter()
                .map(|f| json!({ "key": f, "path": f })),
        );
        let mut volumes =
            vec![json!({ "name": "config", "configMap": { "name": name, "items": items } })];
        if let Some(m) = &process.secret_mount {
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.push(json!({ "name": m.volume, "mountPath": m.mount, "readOnly": true }));
            }
            // Readable by the container's user alone (the pod's fsGroup owns the files).
            volumes.push(json!({
                "name": m.volume,
                "secret": {
                    "secretName": m.secret,
                    "items": [{ "key": m.key, "path": m.key }],
                    "defaultMode": 0o440,
                },
            }));
        }
        if let Some((source, sub_path)) = &process.tokenizer {
            let mut mount =
                json!({ "name": "tokenizer", "mountPath": TOKENIZER_MOUNT, "readOnly": true });
            if let Some(p) = sub_path {
                mount["subPath"] = json!(p);
            }
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.push(mount);
            }
            let mut volume = source.clone();
            volume["name"] = json!("tokenizer");
            volumes.push(volume);
        }
        let mut pod_spec = json!({
            "serviceAccountName": name,
            "automountServiceAccountToken": sched.is_some(),
            "securityContext": {
                "runAsNonRoot": true,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [container],
            "volumes": volumes,
        });
        if process.secret_mount.is_some() {
            pod_spec["securityContext"]["fsGroup"] = json!(65532);
        }
        if !self.opts.image_pull_secrets.is_empty() {
            pod_spec["imagePullSecrets"] = self
                .opts
                .image_pull_secrets
                .iter()
                .map(|n| json!({ "name": n }))
                .collect();
        }
        if let Some(g) = process.grace_seconds {
            // Counted from the start of the preStop sleep.
            pod_spec["terminationGracePeriodSeconds"] = json!(g + PRE_STOP_SLEEP_SECONDS);
        }
        if replicas > 1 {
            pod_spec["topologySpreadConstraints"] = json!([{
                "maxSkew": 1,
                "topologyKey": SPREAD_TOPOLOGY_KEY,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": { "matchLabels": self.selector(component, sched) },
                // Only the pods of the same revision: during a rollout the old ones are leaving.
                "matchLabelKeys": ["pod-template-hash"],
            }]);
        }
        if !pd.node_selector.is_empty() {
            pod_spec["nodeSelector"] = json!(pd.node_selector);
        }
        if !pd.tolerations.is_empty() {
            pod_spec["tolerations"] = json!(pd.tolerations);
        }
        if let Some(a) = &pd.affinity {
            pod_spec["affinity"] = json!(a);
        }
        typed(
            "Deployment",
            json!({
                "metadata": self.meta(name, component, sched)?,
                "spec": {
                    "replicas": replicas,
                    "selector": { "matchLabels": self.selector(component, sched) },
                    "template": {
                        "metadata": { "labels": labels, "annotations": annotations },
                        "spec": pod_spec,
                    },
                },
            }),
        )
    }

    /// How long a stopping BBR pod is given before it is killed: the longest any scheduler's
    /// picker is given, since every routed request passes the router first.
    fn bbr_grace_seconds(&self) -> Result<u64, Error> {
        let mut longest = PICKER_GRACE_MARGIN_SECONDS;
        for s in &self.cfg.spec.schedulers {
            longest = longest.max(self.picker_grace_seconds(s)?);
        }
        Ok(longest)
    }

    /// How long a stopping picker pod is given before it is killed: the longest a request's
    /// ext_proc stream to it can last, so a rollout or a drain lets the answers in flight finish.
    /// The stream carries the response body too (Envoy AI Gateway's filter streams both bodies to
    /// the picker), so it lasts from the request's arrival through its wait in the queue (the
    /// flow-control TTL) to the end of the answer (the route's request timeout, which starts once
    /// the picker has let the request go), and the picker, told to stop, lets open streams
    /// finish. At Kubernetes' default of 30 s every answer still streaming then was cut.
    /// Unbounded (a `0s` route timeout or TTL) is capped at [`PICKER_GRACE_CAP_SECONDS`].
    fn picker_grace_seconds(&self, s: &SchedulerSpec) -> Result<u64, Error> {
        let queue = match &self.cfg.spec.flow_control {
            None => Some(std::time::Duration::ZERO),
            Some(f) => {
                let settings: infergate_pool::flow::FlowSettings =
                    serde_json::from_value(json!({ "flowControl": f })).map_err(|e| {
                        Error::PickerFile {
                            field: "flowControl",
                            reason: e.to_string(),
                        }
                    })?;
                let ttl = settings.flow_control.request_ttl;
                (!ttl.is_zero()).then_some(ttl)
            }
        };
        Ok(match (queue, s.route_deadline()) {
            (Some(q), Some(r)) => (q + r)
                .as_secs()
                .saturating_add(PICKER_GRACE_MARGIN_SECONDS)
                .min(PICKER_GRACE_CAP_SECONDS),
            _ => PICKER_GRACE_CAP_SECONDS,
        })
    }

    /// Admits only what a picker or BBR pod must answer: ext_proc from this config's Envoy
    /// Gateway data plane (the pods Envoy Gateway labels with the owning Gateway, in any
    /// namespace, since it runs them in its own), and health and metrics from anywhere (kubelet
    /// probes and Prometheus). Egress is left open: the picker scrapes model-server pods and
    /// watches the API server.
    fn network_policy(
        &self,
        name: &str,
        component: &str,
        sched: Option<&str>,
        ports: &[(&str, i32)],
    ) -> Result<NetworkPolicy, Error> {
        let port_of = |names: &[&str]| -> Vec<Value> {
            ports
                .iter()
                .filter(|(n, _)| names.contains(n))
                .map(|(_, p)| json!({ "protocol": "TCP", "port": p }))
                .collect()
        };
        typed(
            "NetworkPolicy",
            json!({
                "metadata": self.meta(name, component, sched)?,
                "spec": {
                    "podSelector": { "matchLabels": self.selector(component, sched) },
                    "policyTypes": ["Ingress"],
                    "ingress": [
                        {
                            // The Gateway's own proxy, or the merged proxy of its class: Envoy
                            // Gateway labels a proxy by the one or the other, never both.
                            "from": [
                                {
                                    "namespaceSelector": {},
                                    "podSelector": { "matchLabels": {
                                        EG_OWNING_GATEWAY_NAME: self.name,
                                        EG_OWNING_GATEWAY_NAMESPACE: self.namespace,
                                    } },
                                },
                                {
                                    "namespaceSelector": {},
                                    "podSelector": { "matchLabels": {
                                        EG_OWNING_GATEWAY_CLASS: self.cfg.spec.gateway.class_name,
                                    } },
                                },
                            ],
                            "ports": port_of(&["grpc"]),
                        },
                        { "ports": port_of(&["health", "metrics"]) },
                    ],
                },
            }),
        )
        .map(|mut p: NetworkPolicy| {
            // The peer exchange: only from the other replicas of the same picker.
            let peer = port_of(&["peer"]);
            if !peer.is_empty()
                && let Some(rules) = p.spec.as_mut().and_then(|s| s.ingress.as_mut())
                && let Ok(rule) = serde_json::from_value(json!({
                    "from": [{ "podSelector": { "matchLabels": self.selector(component, sched) } }],
                    "ports": peer,
                }))
            {
                rules.push(rule);
            }
            p
        })
    }

    /// The headless Service over a picker's pods on the peer port: its DNS name resolves to
    /// every replica's pod address, ready or not (a replica exchanges its load before its pods
    /// have metrics), for `--peer`.
    fn peer_service(
        &self,
        epp: &str,
        component: &str,
        sched: Option<&str>,
    ) -> Result<Service, Error> {
        typed(
            "Service",
            json!({
                "metadata": self.meta(&peer_service_name(epp), component, sched)?,
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": true,
                    "selector": self.selector(component, sched),
                    "ports": [{ "name": "peer", "port": PEER_PORT, "targetPort": "peer", "protocol": "TCP" }],
                },
            }),
        )
    }

    fn service(
        &self,
        name: &str,
        component: &str,
        sched: Option<&str>,
        ports: &[(&str, i32)],
        grpc_tls: bool,
    ) -> Result<Service, Error> {
        let ports: Vec<Value> = ports
            .iter()
            .map(|(n, p)| {
                let mut v = json!({ "name": n, "port": p, "targetPort": n, "protocol": "TCP" });
                // Plaintext HTTP/2 is `kubernetes.io/h2c`; HTTP/2 over TLS has no standard
                // appProtocol value, so a TLS port carries none.
                if *n == "grpc" && !grpc_tls {
                    v["appProtocol"] = json!("kubernetes.io/h2c");
                }
                v
            })
            .collect();
        typed(
            "Service",
            json!({
                "metadata": self.meta(name, component, sched)?,
                "spec": { "selector": self.selector(component, sched), "ports": ports },
            }),
        )
    }

    fn pdb(
        &self,
        name: &str,
        component: &str,
        sched: Option<&str>,
    ) -> Result<PodDisruptionBudget, Error> {
        typed(
            "PodDisruptionBudget",
            json!({
                "metadata": self.meta(name, component, sched)?,
                "spec": { "maxUnavailable": 1, "selector": { "matchLabels": self.selector(component, sched) } },
            }),
        )
    }
}

/// One process the render runs in a Deployment: its command line (from the binary's own
/// argument struct), the ports that command line opens, and the ConfigMap file it reads.
struct Process<'a> {
    args: Vec<String>,
    ports: &'a [(&'a str, i32)],
    config_file: &'a str,
    /// Further files of the same ConfigMap the process reads: the picker's model rewrites (not
    /// in the hash: reloaded in place), quotas and flow control (in the hash).
    extra_files: Vec<&'a str>,
    /// Environment variables of this process alone, after the common ones.
    env: Vec<Value>,
    /// A Secret's key mounted as a file (the pickers' peer-exchange key).
    secret_mount: Option<SecretMount<'a>>,
    /// The tokenizer's volume (a ConfigMap or PersistentVolumeClaim source) and the directory
    /// within it, mounted read-only at [`TOKENIZER_MOUNT`].
    tokenizer: Option<(Value, Option<String>)>,
    config_hash: &'a str,
    /// The pod's `terminationGracePeriodSeconds`; Kubernetes' default (30 s) when `None`.
    grace_seconds: Option<u64>,
}

/// One key of a Secret, mounted read-only as a file named after the key.
struct SecretMount<'a> {
    volume: &'a str,
    secret: String,
    key: &'a str,
    mount: &'a str,
}

/// A container's `env`, each name once (the API server treats the list as a map keyed by name,
/// and server-side apply refuses a duplicate key): the variables set on every container, then
/// `podDefaults.env`, whose value replaces a common one of the same name where it stands (and a
/// later entry an earlier one), then the process's own, which replace either (the Redis
/// password from `passwordSecretRef`).
fn container_env(
    common: Vec<Value>,
    user: impl IntoIterator<Item = Value>,
    process: impl IntoIterator<Item = Value>,
) -> Vec<Value> {
    let mut env = common;
    for var in user.into_iter().chain(process) {
        match env.iter_mut().find(|e| e["name"] == var["name"]) {
            Some(slot) => *slot = var,
            None => env.push(var),
        }
    }
    env
}

/// The picker's `--rewrites` file for `s`, `None` without rules. Checked here with the
/// picker's own compiler, so a rule the picker would refuse is a render error.
fn rewrites_yaml(s: &SchedulerSpec) -> Result<Option<String>, Error> {
    if s.model_rewrites.is_empty() {
        return Ok(None);
    }
    let v = serde_json::to_value(&s.model_rewrites).map_err(|source| Error::Shape {
        kind: "modelRewrites",
        source,
    })?;
    let rules: Vec<RewriteRule> = serde_json::from_value(v)
        .map_err(|e| Error::SchedulerConfig(format!("modelRewrites: {e}")))?;
    Rewrites::new(&rules).map_err(|e| Error::SchedulerConfig(format!("modelRewrites: {e}")))?;
    to_yaml(&rules).map(Some)
}

/// The picker's `--quotas` file, `None` without `spec.quotas`: the CRD's fields in the picker's
/// own format, with `redis.passwordSecretRef` turned into `passwordEnv: `[`REDIS_PASSWORD_ENV`].
/// Checked with the picker's own parser and checks, so a file the picker would refuse is a
/// render error (reported as `Accepted=False`) rather than a crash-looping pod.
pub fn quotas_yaml(spec: &InferenceGatewayConfigSpec) -> Result<Option<String>, Error> {
    let Some(q) = &spec.quotas else {
        return Ok(None);
    };
    let mut v = serde_json::to_value(q).map_err(|source| Error::Shape {
        kind: "quotas",
        source,
    })?;
    if let Some(redis) = v.get_mut("redis").and_then(Value::as_object_mut)
        && redis.remove("passwordSecretRef").is_some()
    {
        redis.insert("passwordEnv".to_owned(), json!(REDIS_PASSWORD_ENV));
    }
    let file: infergate_pool::quota::QuotasSpec =
        serde_json::from_value(v).map_err(|e| Error::PickerFile {
            field: "quotas",
            reason: e.to_string(),
        })?;
    // The password is the pod's, not this process's: check everything else.
    let mut checked = file.clone();
    if let Some(r) = checked.redis.as_mut() {
        r.password_env = None;
    }
    checked.to_config().map_err(|reason| Error::PickerFile {
        field: "quotas",
        reason,
    })?;
    to_yaml(&file).map(Some)
}

/// The picker's `--flow-control` file, `None` without `spec.flowControl` and `spec.tenancy`:
/// both sections (`flowControl:`, `tenancy:`) as the CR writes them (the picker fills in its
/// defaults, as for the gateway file), checked with the picker's own parser,
/// `FlowConfig::validate` and `Tenancy::new`.
pub fn flow_control_yaml(spec: &InferenceGatewayConfigSpec) -> Result<Option<String>, Error> {
    if spec.flow_control.is_none() && spec.tenancy.is_none() {
        return Ok(None);
    }
    let shape = |source| Error::Shape {
        kind: "flowControl",
        source,
    };
    let invalid = |field: &'static str, reason: String| Error::PickerFile { field, reason };
    let mut v = json!({});
    if let Some(f) = &spec.flow_control {
        v["flowControl"] = serde_json::to_value(f).map_err(shape)?;
    }
    if let Some(t) = &spec.tenancy {
        v["tenancy"] = serde_json::to_value(t).map_err(shape)?;
    }
    let settings: infergate_pool::flow::FlowSettings =
        serde_json::from_value(v.clone()).map_err(|e| invalid("flowControl", e.to_string()))?;
    settings
        .flow_control
        .validate()
        .map_err(|e| invalid("flowControl", e.to_string()))?;
    infergate_pool::tenant::Tenancy::new(&settings.tenancy)
        .map_err(|e| invalid("tenancy", e.to_string()))?;
    to_yaml(&v).map(Some)
}

/// The pickers' `INFERGATE_QUOTA_REDIS_PASSWORD` from `spec.quotas.redis.passwordSecretRef`.
fn redis_password_env(spec: &InferenceGatewayConfigSpec) -> Vec<Value> {
    spec.quotas
        .as_ref()
        .and_then(|q| q.redis.as_ref())
        .and_then(|r| r.password_secret_ref.as_ref())
        .map(|s| {
            json!({
                "name": REDIS_PASSWORD_ENV,
                "valueFrom": { "secretKeyRef": { "name": s.name, "key": s.key } },
            })
        })
        .into_iter()
        .collect()
}

/// Requests sized for the measured footprint of a picker or BBR at a few thousand requests per
/// second, with a memory limit so a leak cannot take the node; `podDefaults.resources` replaces
/// them as a whole.
fn default_resources() -> Value {
    json!({
        "requests": { "cpu": "100m", "memory": "128Mi" },
        "limits": { "memory": "512Mi" },
    })
}

/// The scheduler configuration one scheduler's picker runs with: the preset, or the `infergate`
/// preset with the CRD's weights in place of its own (scorers the CRD leaves out weigh 0). The
/// CRD's weights map onto the scheduler's by name; a CRD weight the scheduler does not know is a
/// render error, never a silently dropped scorer.
pub fn scheduler_config(s: &SchedulerSpec) -> Result<SchedulerConfig, Error> {
    let cfg = match (s.effective_preset(), &s.weights) {
        (Some(p), _) => {
            let preset =
                p.as_str()
                    .parse()
                    .map_err(|e: infergate_scheduler::UnknownPresetError| {
                        Error::SchedulerConfig(e.to_string())
                    })?;
            SchedulerConfig::preset(preset)
        }
        (None, weights) => {
            let v = serde_json::to_value(weights).map_err(|source| Error::Shape {
                kind: "weights",
                source,
            })?;
            SchedulerConfig {
                weights: serde_json::from_value(v)
                    .map_err(|e| Error::SchedulerConfig(format!("weights: {e}")))?,
                ..SchedulerConfig::default()
            }
        }
    };
    let mut cfg = cfg;
    if let Some(st) = &s.stale_metrics {
        if let Some(m) = st.mode {
            cfg.stale_metrics.mode = match m {
                infergate_api::config::StaleMode::FailOpen => StaleMode::FailOpen,
                infergate_api::config::StaleMode::FailClosed => StaleMode::FailClosed,
            };
        }
        if let Some(n) = st.max_inflight_per_endpoint {
            cfg.stale_metrics.max_inflight_per_endpoint = n;
        }
    }
    match &s.outlier_detection {
        // Absent: the preset's (on under `infergate` and custom weights).
        None => {}
        Some(o) if o.enabled == Some(false) => cfg.outlier_detection = None,
        Some(o) => {
            let d = infergate_scheduler::outlier::OutlierDetection::default();
            cfg.outlier_detection = Some(infergate_scheduler::outlier::OutlierDetection {
                consecutive_5xx: o.consecutive_5xx.unwrap_or(d.consecutive_5xx),
                base_ejection_ms: o.base_ejection_ms(),
                max_ejection_ms: o.max_ejection_ms(),
                max_ejection_percent: o.max_ejection_percent.unwrap_or(d.max_ejection_percent),
                failure_percentage: o.failure_percentage.as_ref().map(|f| {
                    let d = infergate_scheduler::outlier::FailurePercentage::default();
                    infergate_scheduler::outlier::FailurePercentage {
                        threshold: f.threshold.unwrap_or(d.threshold),
                        minimum_requests: f.minimum_requests.unwrap_or(d.minimum_requests),
                        interval_ms: f.interval_ms.unwrap_or(d.interval_ms),
                    }
                }),
            });
        }
    }
    // Envoy Gateway routes an InferencePool backend through an ORIGINAL_DST cluster that reads
    // `x-gateway-destination-endpoint` as one `ip:port` (docs/operator.md cites the source); a
    // fallback list there is not an address. So the picker answers with its first choice only.
    let cfg = SchedulerConfig {
        returned_endpoints: 1,
        ..cfg
    };
    cfg.validate()
        .map_err(|e| Error::SchedulerConfig(e.to_string()))?;
    Ok(cfg)
}

/// `maxRequestBodyBytes` as the processes take it.
fn body_limit(bytes: i64) -> Result<usize, Error> {
    usize::try_from(bytes).map_err(|_| {
        Error::SchedulerConfig(format!(
            "maxRequestBodyBytes must be a positive byte count, got {bytes}"
        ))
    })
}

fn typed<T: DeserializeOwned>(kind: &'static str, v: Value) -> Result<T, Error> {
    serde_json::from_value(v).map_err(|source| Error::Shape { kind, source })
}

fn child<K>(obj: &K) -> Result<Child, Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let resource = ApiResource::erase::<K>(&());
    let mut value = serde_json::to_value(obj).map_err(|source| Error::Shape {
        kind: "child",
        source,
    })?;
    // Typed objects from k8s-openapi do not always serialise apiVersion/kind; SSA needs both.
    value["apiVersion"] = json!(resource.api_version);
    value["kind"] = json!(resource.kind);
    let object: DynamicObject = serde_json::from_value(value).map_err(|source| Error::Shape {
        kind: "child",
        source,
    })?;
    Ok(Child { resource, object })
}

/// The serde name of a unit enum value (`FailClose`, `kubernetes.io/h2c`, …).
fn json_str<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

fn to_yaml<T: Serialize>(v: &T) -> Result<String, Error> {
    serde_yaml::to_string(v).map_err(Error::Yaml)
}

/// FNV-1a, hex: a hash that stays the same across Rust releases (golden files depend on it).
fn fnv_hex(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests;
