use super::*;

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
