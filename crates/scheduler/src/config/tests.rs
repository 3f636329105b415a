use super::*;

#[test]
fn every_preset_validates_and_round_trips_by_name() {
    for p in Preset::ALL {
        SchedulerConfig::preset(p).validate().unwrap();
        assert_eq!(p.as_str().parse::<Preset>().unwrap(), p);
        let yaml = format!("preset: {p}\n");
        let cfg: SchedulerConfig = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(cfg, SchedulerConfig::preset(p));
    }
    assert!(
        "weighted"
            .parse::<Preset>()
            .unwrap_err()
            .to_string()
            .contains("weighted")
    );
}

#[test]
fn gie_default_has_the_reference_weights() {
    let c = SchedulerConfig::preset(Preset::GieDefault);
    assert_eq!(
        (c.weights.queue, c.weights.kv_cache, c.weights.prefix),
        (2.0, 2.0, 3.0)
    );
    assert_eq!(c.weights.estimated_wait, 0.0);
    assert!(!c.inflight_accounting);
    assert_eq!(c.max_metrics_age, None);
}

#[test]
fn explicit_weights_replace_the_presets() {
    let cfg: SchedulerConfig =
        serde_yaml::from_str("preset: infergate\nweights:\n  queue: 3\n  kvCache: 1\n").unwrap();
    assert_eq!(
        cfg.weights,
        Weights {
            queue: 3.0,
            kv_cache: 1.0,
            ..Weights::default()
        }
    );
    assert_eq!(cfg.policy, Policy::Scored);
    cfg.validate().unwrap();
}

#[test]
fn serialised_config_reads_back_identically() {
    for p in Preset::ALL {
        let c = SchedulerConfig::preset(p);
        let json = serde_json::to_string(&c).unwrap();
        let back: SchedulerConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c, "{json}");
    }
    let c: SchedulerConfig = serde_yaml::from_str("maxMetricsAgeMs: null\n").unwrap();
    assert_eq!(c.max_metrics_age, None);
    let c: SchedulerConfig = serde_yaml::from_str("maxMetricsAgeMs: 500\n").unwrap();
    assert_eq!(c.max_metrics_age, Some(Duration::from_millis(500)));
}

#[test]
fn validation_errors_name_the_field() {
    let cases: [(&str, &str); 8] = [
        ("weights:\n  queue: -1\n", "weights.queue"),
        ("weights:\n  prefix: 0\n", "weights"),
        ("returnedEndpoints: 0\n", "returnedEndpoints"),
        ("returnedEndpoints: 9\n", "returnedEndpoints"),
        (
            "saturation:\n  queueDepth: 4\n  kvCache: 1.5\n",
            "saturation.kvCache",
        ),
        ("retryAfterMinMs: 10\n", "retryAfterMinMs"),
        ("prefix:\n  blockChars: 2\n", "prefix.blockChars"),
        (
            "rates:\n  prefillTokensPerSec: 0\n",
            "rates.prefillTokensPerSec",
        ),
    ];
    for (yaml, field) in cases {
        let cfg: SchedulerConfig = serde_yaml::from_str(yaml).unwrap();
        let err = cfg.validate().unwrap_err();
        assert_eq!(err.field, field, "{yaml}");
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn unknown_keys_and_presets_are_errors() {
    let err = serde_yaml::from_str::<SchedulerConfig>("wieghts: {}\n").unwrap_err();
    assert!(err.to_string().contains("wieghts"), "{err}");
    let err = serde_yaml::from_str::<SchedulerConfig>("preset: fastest\n").unwrap_err();
    assert!(err.to_string().contains("fastest"), "{err}");
    let err = serde_yaml::from_str::<SchedulerConfig>("weights:\n  speed: 1\n").unwrap_err();
    assert!(err.to_string().contains("speed"), "{err}");
}

#[test]
fn the_candidate_sample_defaults_to_16_and_0_turns_it_off() {
    assert_eq!(SchedulerConfig::default().candidate_sample, 16);
    let cfg: SchedulerConfig = serde_yaml::from_str("candidateSample: 0\n").unwrap();
    assert_eq!(cfg.candidate_sample, 0);
    cfg.validate().unwrap();
    let back: SchedulerConfig =
        serde_yaml::from_str(&serde_yaml::to_string(&cfg).unwrap()).unwrap();
    assert_eq!(back, cfg);
    assert!(serde_yaml::from_str::<SchedulerConfig>("candidateSample: -1\n").is_err());
}
