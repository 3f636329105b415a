//! Deleting configs and waiting for the operator to clean them up: what the Helm chart's
//! `pre-delete` hook runs (`infergate delete-configs`).
//!
//! Each config carries the finalizer [`crate::reconcile::FINALIZER`], which only a running
//! operator removes (after deleting the children). `helm uninstall` deletes the operator's
//! Deployment together with the configs the chart created, so without this step those configs
//! stay `Terminating` for ever. The hook runs before Helm deletes anything: it deletes the
//! release's configs, then waits until the operator has let each one go.

use std::time::Duration;

use infergate_api::InferenceGatewayConfig;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;
use tracing::info;

/// Why [`delete_and_wait`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// No cluster to talk to: neither in a pod nor with a kubeconfig.
    #[error(
        "cannot reach a Kubernetes API server (no in-cluster service account, no usable kubeconfig)"
    )]
    NoCluster(#[source] kube::Error),
    /// The API server refused or failed a request.
    #[error("{action} InferenceGatewayConfigs matching `{selector}` failed")]
    Api {
        /// What was being done (`listing`, `deleting inference/llama`).
        action: String,
        /// The label selector.
        selector: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// Configs were still there when the time was up: the operator is not running, or cannot
    /// delete their children.
    #[error(
        "{} InferenceGatewayConfig(s) matching `{selector}` still exist after {}s: {}; \
         is the operator running? (its logs and each config's status say why a cleanup fails)",
        left.len(),
        timeout.as_secs(),
        left.join(", ")
    )]
    TimedOut {
        /// The label selector.
        selector: String,
        /// How long it waited.
        timeout: Duration,
        /// `namespace/name` of each config left, with its finalizers.
        left: Vec<String>,
    },
}

/// [`delete_and_wait`] with the client of the pod (its service account) or of the kubeconfig,
/// polling every two seconds.
pub async fn delete_and_wait_in_cluster(
    selector: &str,
    timeout: Duration,
) -> Result<Vec<String>, UninstallError> {
    let client = Client::try_default()
        .await
        .map_err(UninstallError::NoCluster)?;
    delete_and_wait(client, selector, timeout, Duration::from_secs(2)).await
}

/// Deletes every `InferenceGatewayConfig` in every namespace that matches the label
/// `selector`, then waits (polling every `poll`) until none is left or `timeout` has passed.
/// Returns the `namespace/name` of the configs it deleted. A config already being deleted is
/// waited for, not deleted again; one that vanishes meanwhile is simply gone.
pub async fn delete_and_wait(
    client: Client,
    selector: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<Vec<String>, UninstallError> {
    let deadline = Instant::now() + timeout;
    let api: Api<InferenceGatewayConfig> = Api::all(client.clone());
    let params = ListParams::default().labels(selector);
    let api_error = |action: String| {
        let selector = selector.to_owned();
        move |source| UninstallError::Api {
            action,
            selector,
            source,
        }
    };
    let found = api
        .list(&params)
        .await
        .map_err(api_error("listing".to_owned()))?;
    let mut deleted = Vec::new();
    for cfg in &found.items {
        let (ns, name) = (cfg.namespace().unwrap_or_default(), cfg.name_any());
        if cfg.metadata.deletion_timestamp.is_none() {
            let namespaced: Api<InferenceGatewayConfig> = Api::namespaced(client.clone(), &ns);
            match namespaced.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(config = %format!("{ns}/{name}"), "deleting"),
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(e) => return Err(api_error(format!("deleting {ns}/{name}"))(e)),
            }
        }
        deleted.push(format!("{ns}/{name}"));
    }
    loop {
        let left = api
            .list(&params)
            .await
            .map_err(api_error("listing".to_owned()))?;
        if left.items.is_empty() {
            info!(
                selector,
                configs = deleted.len(),
                "every matching config is gone"
            );
            return Ok(deleted);
        }
        if Instant::now() >= deadline {
            return Err(UninstallError::TimedOut {
                selector: selector.to_owned(),
                timeout,
                left: left
                    .items
                    .iter()
                    .map(|c| {
                        format!(
                            "{}/{} (finalizers: {})",
                            c.namespace().unwrap_or_default(),
                            c.name_any(),
                            c.finalizers().join(", ")
                        )
                    })
                    .collect(),
            });
        }
        tokio::time::sleep(poll.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}
