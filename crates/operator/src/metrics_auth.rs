//! Who may read the operator's `/metrics`: a caller whose bearer token the API server
//! authenticates (a `TokenReview`) and authorises to `get` the non-resource URL `/metrics` (a
//! `SubjectAccessReview`), as controller-runtime's secure metrics
//! (`filters.WithAuthenticationAndAuthorization`) and kube-rbac-proxy check it. Prometheus sends
//! its ServiceAccount's token; binding that account to the chart's `metrics-reader` ClusterRole
//! lets it in. The probes (`/healthz`, `/readyz`) stay open: the kubelet sends no token.
//!
//! Each decision is kept a short while per token ([`ALLOWED_TTL`], [`REFUSED_TTL`]), so a
//! scrape every 15 s costs the API server two reviews a minute at most, and at most
//! [`CACHE_ENTRIES`] tokens are remembered, by their SHA-256 (a flood of made-up tokens costs
//! reviews, not memory).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::Error;

/// How `/metrics` is protected (`--metrics-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricsAuth {
    /// A bearer token the API server authenticates and authorises for `get` on `/metrics`.
    #[default]
    Kubernetes,
    /// No check: anyone who reaches the port reads the metrics (a cluster whose API server
    /// does not serve TokenReview or SubjectAccessReview, or one where the port is not reachable
    /// from other pods).
    None,
}

/// How long an allowed token is let in without asking the API server again: a revoked token
/// or a withdrawn binding takes effect within this.
pub const ALLOWED_TTL: Duration = Duration::from_secs(60);
/// How long a refused token (not authenticated, or not authorised) stays refused without
/// asking again: short, so a binding just made takes effect soon.
pub const REFUSED_TTL: Duration = Duration::from_secs(10);
/// Tokens whose decision is kept; the one that expires first makes room for a new one.
pub const CACHE_ENTRIES: usize = 256;
/// How long each review may take: Prometheus gives up on a scrape after 10 s by default.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The non-resource URL and verb a scraper must be allowed.
const PATH: &str = "/metrics";
const VERB: &str = "get";

/// What the API server said of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated and allowed to `get` `/metrics`.
    Allowed,
    /// Not authenticated: the TokenReview's error, or that it said no.
    Unauthenticated(String),
    /// Authenticated as the user named, but not allowed (the authoriser's reason, if any).
    Forbidden {
        /// The token's user.
        user: String,
        /// The SubjectAccessReview's reason, empty when it gave none.
        reason: String,
    },
}

/// The answer to a scrape that is not let in.
pub type Refusal = Response<String>;

/// Label set of the refused-scrape counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `no_token` (401), `unauthenticated` (401), `forbidden` (403) or `review_failed` (500).
    pub reason: &'static str,
}

/// Checks scrapes of `/metrics` with the API server, keeping each decision a short while.
pub struct ScrapeAuthorizer {
    client: Client,
    cache: Mutex<Cache>,
    refused: Family<RefusedLabels, Counter>,
}

impl ScrapeAuthorizer {
    /// An authoriser asking the API server behind `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(Cache::default()),
            refused: Family::default(),
        }
    }

    /// Registers `infergate_operator_metrics_scrapes_refused_total{reason}`: a scraper
    /// misconfigured (no token, an expired one, no binding) shows there, on the next scrape
    /// that is let in, rather than only as a target down.
    pub fn register(&self, registry: &mut Registry) {
        registry
            .sub_registry_with_prefix("infergate_operator")
            .register(
                "metrics_scrapes_refused",
                "Scrapes of /metrics refused, by reason",
                self.refused.clone(),
            );
    }

    /// `refusal`, counted under `reason`.
    fn refuse(&self, reason: &'static str, refusal: Refusal) -> Refusal {
        self.refused.get_or_create(&RefusedLabels { reason }).inc();
        refusal
    }

    /// Lets a scrape whose `Authorization` header is `authorization` in, or says why not:
    /// 401 without a bearer token or with one the API server does not authenticate, 403 for a
    /// user not allowed to `get` `/metrics`, 500 when the API server could not be asked.
    pub async fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), Refusal> {
        let Some(token) = bearer(authorization) else {
            let refusal = unauthorized(
                "no bearer token: /metrics needs `Authorization: Bearer <token>`, the token of a \
                 ServiceAccount or user allowed to get the non-resource URL /metrics (bind it to \
                 the chart's metrics-reader ClusterRole)",
            );
            return Err(self.refuse("no_token", refusal));
        };
        match self.verdict(token).await {
            Ok(Verdict::Allowed) => Ok(()),
            Ok(Verdict::Unauthenticated(why)) => {
                debug!(reason = %why, "scrape refused: token not authenticated");
                let refusal = unauthorized(&format!(
                    "the bearer token was not authenticated by the Kubernetes API server: {why}"
                ));
                Err(self.refuse("unauthenticated", refusal))
            }
            Ok(Verdict::Forbidden { user, reason }) => {
                debug!(%user, %reason, "scrape refused: not allowed to get /metrics");
                let reason = if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                };
                let refusal = plain(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "{user} is not allowed to get the non-resource URL /metrics{reason}: bind \
                         it to the chart's metrics-reader ClusterRole"
                    ),
                );
                Err(self.refuse("forbidden", refusal))
            }
            Err(e) => {
                warn!(error = %e.report(), "cannot check a scrape of /metrics");
                let refusal = plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("cannot check the token: {e}"),
                );
                Err(self.refuse("review_failed", refusal))
            }
        }
    }

    /// The decision for `token`: remembered, or asked of the API server (a TokenReview, then a
    /// SubjectAccessReview) and remembered. A failed review is not remembered.
    pub async fn verdict(&self, token: &str) -> Result<Verdict, Error> {
        let key = fingerprint(token);
        if let Some(v) = self.lock().get(&key, Instant::now()) {
            return Ok(v);
        }
        let verdict = self.review(token).await?;
        let ttl = if verdict == Verdict::Allowed {
            ALLOWED_TTL
        } else {
            REFUSED_TTL
        };
        self.lock()
            .insert(key, verdict.clone(), Instant::now() + ttl);
        Ok(verdict)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding it leaves the map whole: every change is one insert or remove.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn review(&self, token: &str) -> Result<Verdict, Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = ask(
            Api::<TokenReview>::all(self.client.clone()),
            &review,
            "TokenReview",
            "tokenreviews.authentication.k8s.io",
        )
        .await?;
        let status = reviewed.status.unwrap_or_default();
        let user = match status.user {
            Some(user) if status.authenticated == Some(true) => user,
            _ => {
                let why = status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "the TokenReview did not authenticate it".to_owned());
                return Ok(Verdict::Unauthenticated(why));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(PATH.to_owned()),
                    verb: Some(VERB.to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let decided = ask(
            Api::<SubjectAccessReview>::all(self.client.clone()),
            &access,
            "SubjectAccessReview",
            "subjectaccessreviews.authorization.k8s.io",
        )
        .await?;
        let status = decided.status.unwrap_or_default();
        if status.allowed {
            return Ok(Verdict::Allowed);
        }
        let reason = [status.reason, status.evaluation_error]
            .into_iter()
            .flatten()
            .filter(|r| !r.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Ok(Verdict::Forbidden { user: name, reason })
    }

    /// The guard [`infergate_pool::admin::serve_guarded`] takes: this check of each scrape.
    pub fn guard(
        self: std::sync::Arc<Self>,
    ) -> impl Fn(
        &http::HeaderMap,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<(), Refusal>> + Send>>
    + Send
    + Sync
    + 'static {
        move |headers| {
            let this = std::sync::Arc::clone(&self);
            let header = headers.get(AUTHORIZATION).cloned();
            Box::pin(async move { this.check(header.as_ref()).await })
        }
    }
}

/// Creates `review` (a TokenReview or a SubjectAccessReview: the answer is in its status).
async fn ask<K>(
    api: Api<K>,
    review: &K,
    kind: &'static str,
    resource: &'static str,
) -> Result<K, Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), review)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(source)) => Err(Error::MetricsReview {
            review: kind,
            resource,
            source: Box::new(source),
        }),
        Err(_) => Err(Error::MetricsReviewTimeout {
            review: kind,
            seconds: REVIEW_TIMEOUT.as_secs(),
        }),
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
fn bearer(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

fn fingerprint(token: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    out
}

fn plain(status: StatusCode, message: &str) -> Refusal {
    let mut r = Response::new(format!("{message}\n"));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn unauthorized(message: &str) -> Refusal {
    let mut r = plain(StatusCode::UNAUTHORIZED, message);
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"infergate-operator metrics\""),
    );
    r
}

/// Decisions by token fingerprint, each until its expiry, at most [`CACHE_ENTRIES`].
#[derive(Default)]
struct Cache {
    entries: HashMap<[u8; 32], (Verdict, Instant)>,
}

impl Cache {
    fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        match self.entries.get(key) {
            Some((v, until)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: [u8; 32], verdict: Verdict, until: Instant) {
        if self.entries.len() >= CACHE_ENTRIES && !self.entries.contains_key(&key) {
            let now = Instant::now();
            self.entries.retain(|_, (_, u)| *u > now);
            if self.entries.len() >= CACHE_ENTRIES
                && let Some(first) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, u))| *u)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&first);
            }
        }
        self.entries.insert(key, (verdict, until));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_header_with_a_token_counts() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(bearer(Some(&h("Bearer abc"))), Some("abc"));
        assert_eq!(bearer(Some(&h("bearer  abc "))), Some("abc"));
        assert_eq!(bearer(Some(&h("Basic abc"))), None);
        assert_eq!(bearer(Some(&h("Bearer "))), None);
        assert_eq!(bearer(Some(&h("Bearer"))), None);
        assert_eq!(bearer(None), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded_and_forgets_expired_decisions() {
        let mut cache = Cache::default();
        let now = Instant::now();
        for i in 0..CACHE_ENTRIES + 10 {
            let key = fingerprint(&i.to_string());
            let until = now + Duration::from_secs(100 + i as u64);
            cache.insert(key, Verdict::Allowed, until);
        }
        assert_eq!(cache.entries.len(), CACHE_ENTRIES);
        // The ones expiring first made room; the newest are kept.
        assert_eq!(cache.get(&fingerprint("0"), now), None);
        let last = (CACHE_ENTRIES + 9).to_string();
        assert_eq!(cache.get(&fingerprint(&last), now), Some(Verdict::Allowed));
        // Past its expiry a decision is gone.
        let later = now + Duration::from_secs(100 + CACHE_ENTRIES as u64 + 10);
        assert_eq!(cache.get(&fingerprint(&last), later), None);
    }
}
