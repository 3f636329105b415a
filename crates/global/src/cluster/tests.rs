use super::*;

use std::sync::Mutex;

fn cluster(yaml: &str) -> Cluster {
    let config = GlobalConfig::from_yaml(yaml).expect("valid configuration");
    Cluster::new(&config, 0)
}

#[test]
fn a_served_model_without_a_heartbeat_yet_is_drained_not_unknown() {
    // `models:` configured, no good heartbeat yet: the cluster serves the model with share 0
    // (drained `unknown`, a last resort), so routing does not answer "no such model".
    let c = cluster(
        "auth: none\nclusters:\n  - { name: a, url: \"http://127.0.0.1:1\", \
         heartbeatUrl: \"http://127.0.0.1:2/heartbeat\", region: r, \
         cost: { inputPerMillion: 1 }, models: [llama] }\n",
    );
    let (weight, _) = c
        .view("llama", Instant::now(), 1.0)
        .expect("a configured model is a candidate before the first heartbeat");
    assert_eq!(weight, 0.0);
    assert!(c.view("other", Instant::now(), 1.0).is_none());
}

#[test]
fn a_discovered_model_without_a_good_heartbeat_is_drained_not_unknown() {
    let c = cluster(
        "auth: none\nclusters:\n  - { name: a, url: \"http://127.0.0.1:1\", \
         heartbeatUrl: \"http://127.0.0.1:2/heartbeat\", region: r, \
         cost: { inputPerMillion: 1 } }\n",
    );
    assert!(c.view("llama", Instant::now(), 1.0).is_none());
    c.set_served(vec!["llama".into()]);
    let (weight, _) = c
        .view("llama", Instant::now(), 1.0)
        .expect("a discovered model is a candidate");
    assert_eq!(weight, 0.0);
    assert_eq!(c.weight("llama", Instant::now()), 0.0);
}

/// Three clusters up for `llama` (the third also alone serving `solo`), with
/// `outlierDetection` as given.
fn fleet(outlier: &str) -> (Vec<Arc<Cluster>>, Telemetry) {
    let mut yaml = format!("auth: none\noutlierDetection: {outlier}\nclusters:\n");
    for (name, models) in [("a", "[llama]"), ("b", "[llama]"), ("c", "[llama, solo]")] {
        yaml.push_str(&format!(
            "  - {{ name: {name}, url: 'http://127.0.0.1:1', region: r, cost: {{ inputPerMillion: 1 }}, models: {models} }}\n"
        ));
    }
    let config = GlobalConfig::from_yaml(&yaml).expect("valid configuration");
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    let clusters: Vec<Arc<Cluster>> = (0..3)
        .map(|i| {
            let c = Arc::new(Cluster::new(&config, i));
            let models = c.served();
            c.apply_models_as_heartbeat(&models, Duration::from_millis(1), now());
            c.tick(now(), &telemetry);
            c
        })
        .collect();
    (clusters, telemetry)
}

#[test]
fn an_ejected_cluster_has_no_share_until_its_time_is_up_then_ramps() {
    let (clusters, telemetry) = fleet("{ baseEjectionMs: 60000 }");
    let deciding = Mutex::new(());
    let at = now();
    assert!(clusters[0].heartbeat_up());
    assert_eq!(clusters[0].weight("llama", at), 1.0);
    eject(&clusters, 0, &deciding, &telemetry);
    assert_eq!(clusters[0].weight("llama", at), 0.0);
    assert_eq!(clusters[1].weight("llama", at), 1.0);
    // Still a candidate (a last resort), not dropped.
    assert!(clusters[0].view("llama", at, 1.0).is_some());
    // Its heartbeat good all along; readmitted through the slow-start ramp (30 s by default).
    let beat = |t: Instant| {
        clusters[0].apply_models_as_heartbeat(&["llama".into()], Duration::from_millis(1), t)
    };
    let after = at + Duration::from_secs(61);
    beat(after - Duration::from_secs(1));
    assert_eq!(
        clusters[0].weight("llama", after - Duration::from_secs(1)),
        0.0
    );
    let w = clusters[0].weight("llama", after);
    assert!(w > 0.0 && w < 0.1, "{w}");
    beat(after + Duration::from_secs(30));
    assert_eq!(
        clusters[0].weight("llama", after + Duration::from_secs(30)),
        1.0
    );
}

#[test]
fn the_percent_of_a_models_clusters_ejected_is_held() {
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 50 }");
    let deciding = Mutex::new(());
    let at = now();
    eject(&clusters, 0, &deciding, &telemetry);
    // A second of llama's three would be 67%: held back.
    eject(&clusters, 1, &deciding, &telemetry);
    eject(&clusters, 2, &deciding, &telemetry);
    let ejected: Vec<bool> = clusters
        .iter()
        .map(|c| c.weight("llama", at) == 0.0)
        .collect();
    assert_eq!(ejected, [true, false, false]);
    let held = |i: usize| {
        telemetry
            .ejections_held_back
            .get_or_create(&clusters[i].label)
            .get()
    };
    assert_eq!((held(0), held(1), held(2)), (0, 1, 1));
    assert_eq!(
        telemetry.ejections.get_or_create(&clusters[0].label).get(),
        1
    );
    assert_eq!(telemetry.ejected.get_or_create(&clusters[0].label).get(), 1);
}

#[test]
fn every_cluster_may_go_at_100_percent_none_at_0() {
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 100 }");
    let deciding = Mutex::new(());
    for i in 0..3 {
        eject(&clusters, i, &deciding, &telemetry);
    }
    assert!(clusters.iter().all(|c| c.weight("llama", now()) == 0.0));
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 0 }");
    for i in 0..3 {
        eject(&clusters, i, &deciding, &telemetry);
    }
    assert!(clusters.iter().all(|c| c.weight("llama", now()) == 1.0));
}

#[test]
fn a_run_of_failures_trips_at_the_threshold_and_a_success_starts_it_again() {
    let (clusters, _) = fleet("{ consecutiveGatewayFailures: 3 }");
    let c = &clusters[0];
    assert!(!c.observe_gateway_failure(true));
    assert!(!c.observe_gateway_failure(true));
    c.observe_success();
    assert!(!c.observe_gateway_failure(true));
    assert!(!c.observe_gateway_failure(true));
    assert!(c.observe_gateway_failure(true));
}

#[test]
fn failures_of_a_drained_or_ejected_cluster_start_no_run() {
    let (clusters, telemetry) = fleet("{ consecutiveGatewayFailures: 2 }");
    let c = &clusters[0];
    // Its heartbeat drained it: the heartbeat decides its return.
    for _ in 0..10 {
        assert!(!c.observe_gateway_failure(false));
    }
    assert_eq!(c.consecutive.get(), 0);
    assert!(!c.observe_gateway_failure(true));
    assert!(c.observe_gateway_failure(true));
    eject(&clusters, 0, &Mutex::new(()), &telemetry);
    assert_eq!(c.consecutive.get(), 0);
    // Requests sent before the ejection, failing during it.
    for _ in 0..10 {
        assert!(!c.observe_gateway_failure(true));
    }
    assert_eq!(c.consecutive.get(), 0);
}
