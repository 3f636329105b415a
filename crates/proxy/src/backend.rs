//! One model's live pool: an `infergate_pool::LivePool`, the registry of its own metrics, and
//! what the gateway needs to decide, on reload, whether the pool can be kept.
//!
//! Each pool registers its scrape and pick metrics in a registry of its own, labelled with the
//! model, rather than in the gateway's: the admin port encodes the pools of the configuration in
//! force at each scrape, so pools started by a reload are exported and removed ones are not.

use std::borrow::Cow;
use std::sync::Arc;

use infergate_metrics::ClientTls;
use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, SchedulerConfig};
use prometheus_client::registry::Registry;

use crate::config::{ModelConfig, Scrape, UpstreamTls};
use crate::error::Error;

pub(crate) use infergate_pool::Inflight;

/// A model's pool. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Backend {
    pub(crate) pool: LivePool,
    /// The pool's scrape and pick metrics, labelled `model`.
    pub(crate) registry: Arc<Registry>,
    config: SchedulerConfig,
    scrape: Scrape,
    /// HTTPS to the model's servers, built from `tls` when the pool started.
    pub(crate) tls: Option<ClientTls>,
    tls_config: Option<UpstreamTls>,
    /// The precise prefix routing it started with (a change starts a new backend).
    precise: Option<infergate_pool::precise::PreciseConfig>,
}

/// HTTPS to `model`'s servers (its `tls` section, with the CA file read), or `None`.
fn client_tls(model: &ModelConfig) -> Result<Option<ClientTls>, Error> {
    let Some(t) = &model.tls else {
        return Ok(None);
    };
    infergate_pool::tls::client_tls(&t.ca_file, t.server_name.as_deref())
        .map(Some)
        .map_err(|source| Error::UpstreamTls {
            model: model.name.clone(),
            source: Box::new(source),
        })
}

/// `model`'s precise prefix routing (its tokenizer loaded), or `None` when it has none.
fn precise(
    model: &ModelConfig,
    registry: Option<&mut Registry>,
) -> Result<Option<infergate_pool::precise::Precise>, Error> {
    let Some(cfg) = &model.precise_prefix else {
        return Ok(None);
    };
    infergate_pool::precise::Precise::new(cfg, registry)
        .map(Some)
        .map_err(|source| Error::Precise {
            model: model.name.clone(),
            source,
        })
}

/// Loads the files `model` names — its `tls.caFile`, its `precisePrefix.tokenizer` — as
/// [`Backend::start`] does, with the same errors, without starting a pool.
pub(crate) fn check_files(model: &ModelConfig) -> Result<(), Error> {
    client_tls(model)?;
    precise(model, None)?;
    Ok(())
}

impl Backend {
    /// The `Retry-After` of an answer that nothing reached a model server for: the scheduler's
    /// `retryAfterMinMs` (a pod is routed to again on its first good scrape).
    pub(crate) fn retry_after_min(&self) -> std::time::Duration {
        self.config.retry_after_min
    }

    /// Starts the pool for `model` with its endpoints. Must run inside a tokio runtime.
    pub(crate) fn start(model: &ModelConfig, scrape: &Scrape, seed: u64) -> Result<Self, Error> {
        let mut registry = Registry::with_labels(std::iter::once((
            Cow::Borrowed("model"),
            Cow::Owned(model.name.clone()),
        )));
        let tls = client_tls(model)?;
        let pool = LivePool::start(
            PoolConfig {
                scheduler: model.scheduler.clone(),
                scrape: infergate_metrics::ScraperConfig {
                    tls: tls.clone(),
                    ..scrape.to_scraper_config()
                },
                seed,
            },
            Some(&mut registry),
        )
        .map_err(|source| Error::Pool {
            model: model.name.clone(),
            source,
        })?;
        if let Some(precise) = precise(model, Some(&mut registry))? {
            // A fresh pool: the first call always takes.
            let _ = pool.enable_precise(precise);
        }
        let backend = Backend {
            pool,
            registry: Arc::new(registry),
            config: model.scheduler.clone(),
            scrape: scrape.clone(),
            tls,
            tls_config: model.tls.clone(),
            precise: model.precise_prefix.clone(),
        };
        backend.set_endpoints(model)?;
        Ok(backend)
    }

    /// Replaces the pool's membership with `model`'s endpoints; endpoints that stay keep their
    /// state and in-flight requests.
    pub(crate) fn set_endpoints(&self, model: &ModelConfig) -> Result<(), Error> {
        let metas = model.endpoints.iter().map(|e| EndpointMeta {
            namespace: model.name.clone(),
            pod: e.name.clone().unwrap_or_else(|| e.address.to_string()),
            addr: e.address,
            engine: e.engine.unwrap_or(model.engine),
            gpu: e.gpu.clone(),
            labels: e.labels.clone(),
        });
        self.pool
            .set_endpoints(metas)
            .map_err(|source| Error::Pool {
                model: model.name.clone(),
                source,
            })
    }

    /// Whether a reload to `model` under `scrape` can keep this pool (same scheduler, scrape
    /// and TLS settings; membership is updated in place).
    pub(crate) fn reusable_for(&self, model: &ModelConfig, scrape: &Scrape) -> bool {
        self.config == model.scheduler
            && &self.scrape == scrape
            && self.tls_config == model.tls
            && self.precise == model.precise_prefix
    }
}
