//! One model's live pool: an `infergate_pool::LivePool` plus what the gateway needs to decide,
//! on reload, whether the pool can be kept.

use infergate_pool::{LivePool, PoolConfig};
use infergate_scheduler::{EndpointMeta, SchedulerConfig};
use prometheus_client::registry::Registry;

use crate::config::{ModelConfig, Scrape};
use crate::error::Error;

pub(crate) use infergate_pool::Inflight;

/// A model's pool. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Backend {
    pub(crate) pool: LivePool,
    config: SchedulerConfig,
    scrape: Scrape,
}

impl Backend {
    /// Starts the pool for `model` with its endpoints. Must run inside a tokio runtime.
    pub(crate) fn start(
        model: &ModelConfig,
        scrape: &Scrape,
        seed: u64,
        registry: Option<&mut Registry>,
    ) -> Result<Self, Error> {
        let pool = LivePool::start(
            PoolConfig {
                scheduler: model.scheduler.clone(),
                scrape: scrape.to_scraper_config(),
                seed,
            },
            registry,
        )
        .map_err(|source| Error::Pool {
            model: model.name.clone(),
            source,
        })?;
        let backend = Backend {
            pool,
            config: model.scheduler.clone(),
            scrape: scrape.clone(),
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

    /// Whether a reload to `model` under `scrape` can keep this pool (same scheduler and scrape
    /// settings; membership is updated in place).
    pub(crate) fn reusable_for(&self, model: &ModelConfig, scrape: &Scrape) -> bool {
        self.config == model.scheduler && &self.scrape == scrape
    }
}
