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

use crate::scope::{WatchScope, api_in, where_};

/// Why [`delete_and_wait`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// No cluster to talk to: neither in a pod nor with a kubeconfig.
    #[error(
        "cannot reach a Kubernetes API server (no in-cluster service account, no usable kubeconfig)"
    )]
    NoCluster(#[source] kube::Error),
    /// The API server refused or failed a request.
    #[error("{action} failed (InferenceGatewayConfigs matching `{selector}`)")]
    Api {
        /// What was being done (`listing in every namespace`, `listing in namespace inference`,
        /// `deleting inference/llama`).
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
    scope: &WatchScope,
    timeout: Duration,
) -> Result<Vec<String>, UninstallError> {
    let client = Client::try_default()
        .await
        .map_err(UninstallError::NoCluster)?;
    delete_and_wait(client, selector, scope, timeout, Duration::from_secs(2)).await
}

/// Deletes every `InferenceGatewayConfig` matching the label `selector` in every namespace, or
/// only in the namespaces of `scope` (through their namespaced paths: the operator's
/// `--watch-namespaces`, where a Role in each namespace grants the hook its rights), then waits
/// (polling every `poll`) until none is left or `timeout` has passed. Returns the
/// `namespace/name` of the configs it deleted. A config already being deleted is waited for,
/// not deleted again; one that vanishes meanwhile is simply gone.
pub async fn delete_and_wait(
    client: Client,
    selector: &str,
    scope: &WatchScope,
    timeout: Duration,
    poll: Duration,
) -> Result<Vec<String>, UninstallError> {
    let deadline = Instant::now() + timeout;
    let params = ListParams::default().labels(selector);
    let found = list_configs(&client, scope, &params, selector).await?;
    let mut deleted = Vec::new();
    for cfg in &found {
        let (ns, name) = (cfg.namespace().unwrap_or_default(), cfg.name_any());
        if cfg.metadata.deletion_timestamp.is_none() {
            let namespaced: Api<InferenceGatewayConfig> = Api::namespaced(client.clone(), &ns);
            match namespaced.delete(&name, &DeleteParams::default()).await {
                Ok(_) => info!(config = %format!("{ns}/{name}"), "deleting"),
                Err(kube::Error::Api(e)) if e.code == 404 => continue,
                Err(source) => {
                    return Err(UninstallError::Api {
                        action: format!("deleting {ns}/{name}"),
                        selector: selector.to_owned(),
                        source,
                    });
                }
            }
        }
        deleted.push(format!("{ns}/{name}"));
    }
    loop {
        let left = list_configs(&client, scope, &params, selector).await?;
        if left.is_empty() {
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

/// The configs `params` selects in every namespace, or in each namespace of `scope`.
async fn list_configs(
    client: &Client,
    scope: &WatchScope,
    params: &ListParams,
    selector: &str,
) -> Result<Vec<InferenceGatewayConfig>, UninstallError> {
    let mut items = Vec::new();
    for ns in scope.targets() {
        let api: Api<InferenceGatewayConfig> = api_in(client, ns.as_deref());
        let found = api
            .list(params)
            .await
            .map_err(|source| UninstallError::Api {
                action: format!("listing {}", where_(ns.as_deref())),
                selector: selector.to_owned(),
                source,
            })?;
        items.extend(found.items);
    }
    Ok(items)
}
