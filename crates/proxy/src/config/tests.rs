use super::*;

const GOOD: &str = "
listen: 127.0.0.1:0
auth: none
models:
  - name: llama
    loraAdapters: [sql-lora]
    scheduler: { preset: round-robin }
    endpoints:
      - 127.0.0.1:8001
      - { address: 127.0.0.1:8002, name: pod-b, gpu: a10g }
";

#[test]
fn a_good_file_parses_with_defaults() {
    let c = GatewayConfig::from_yaml(GOOD).unwrap();
    assert_eq!(c.models.len(), 1);
    let m = &c.models[0];
    assert_eq!(m.engine, EngineType::Vllm);
    assert_eq!(m.scheduler.preset, infergate_scheduler::Preset::RoundRobin);
    assert_eq!(m.endpoints[1].name.as_deref(), Some("pod-b"));
    assert_eq!(c.retries.max_attempts, 3);
    assert_eq!(c.limits.max_request_body_bytes, DEFAULT_MAX_BODY_BYTES);
    assert_eq!(c.timeouts.connect, Duration::from_secs(2));
    assert_eq!(c.timeouts.pool_idle, Duration::from_secs(4));
    assert_eq!(c.admin, SocketAddr::from(([127, 0, 0, 1], 9090)));
}

fn err(text: &str) -> String {
    GatewayConfig::from_yaml(&format!("{text}auth: none\n"))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_bad_address_names_the_field_and_line() {
    let e = err("models:\n  - name: a\n    endpoints:\n      - 127.0.0.1:1\n      - nope\n");
    assert!(e.contains("models[0].endpoints[1]"), "{e}");
    assert!(e.contains("line 5"), "{e}");
}

/// `listen: 8080` (a port alone) or a host name said only "invalid socket address syntax".
#[test]
fn a_listen_or_admin_that_is_not_ip_and_port_says_what_to_write() {
    for (text, shown) in [
        ("listen: 8080\n", "8080"),
        ("admin: localhost:9090\n", "localhost:9090"),
    ] {
        let e = err(text);
        assert!(
            e.contains(&format!(
                "`{shown}` is not an address: write an IP address and a port"
            )),
            "{text}: {e}"
        );
        assert!(e.contains("line 1"), "{e}");
    }
}

#[test]
fn an_unknown_field_names_the_field_and_line() {
    let e = err("models:\n  - name: a\n    endpoints: []\n    wieghts: {}\n");
    assert!(e.contains("wieghts") && e.contains("line 4"), "{e}");
}

#[test]
fn a_bad_preset_names_the_field() {
    let e = err("models:\n  - name: a\n    scheduler: { preset: fastest }\n");
    assert!(e.contains("models[0].scheduler"), "{e}");
    assert!(e.contains("fastest"), "{e}");
}

#[test]
fn semantic_errors_name_the_model_and_line() {
    let e = err("models:\n  - name: a\n    endpoints: [127.0.0.1:1, 127.0.0.1:1]\n");
    assert!(e.contains("listed twice") && e.contains("model `a`"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    let e = err("models:\n  - name: a\n  - name: b\n    loraAdapters: [a]\n");
    assert!(e.contains("configured twice"), "{e}");
    let e = err("models: []\n");
    assert!(e.contains("at least one model"), "{e}");
    let e = err("retries: { maxAttempts: 0 }\nmodels:\n  - name: a\n");
    assert!(e.contains("maxAttempts"), "{e}");
    let e = err("models:\n  - name: a\n    podSelector: { app: vllm }\n");
    assert!(e.contains("podSelector"), "{e}");
}

#[test]
fn not_yaml_is_a_clear_error() {
    let e = err("models: [\n");
    assert!(e.contains("line"), "{e}");
}

#[test]
fn a_top_level_key_given_twice_names_the_line_of_the_second() {
    // serde_yaml gives no position for the top-level mapping; the gateway finds the line. Nested
    // duplicates already carry serde_yaml's own position.
    let text = "auth: none\nmodels:\n  - name: a\n    endpoints: [127.0.0.1:1]\nlisten: 127.0.0.1:1\n\"models\" : []\n";
    let e = GatewayConfig::from_yaml(text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the top-level key `models` is given twice, the second time at line 6"
    );
    assert_eq!(chain(&e)[1], "duplicate field `models`");
    let e = err("limits: { maxConnections: 1, maxConnections: 2 }\n");
    assert!(
        e.contains("duplicate field `maxConnections` at line 1"),
        "{e}"
    );
    // JSON on one line has no line to name: the parser's message stays.
    let e = GatewayConfig::from_yaml(r#"{"auth": "none", "auth": "none"}"#).unwrap_err();
    assert_eq!(e.to_string(), "duplicate field `auth`");
    // A file that starts with a comment, a blank line or `---` (the parser then names the
    // mapping's start, line 2): the second `models` is named all the same. It said
    // ``duplicate field `models` at line 2 column 1``.
    for head in ["# gw.yaml\n", "\n", "---\n"] {
        let e = GatewayConfig::from_yaml(&format!("{head}{text}")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the top-level key `models` is given twice, the second time at line 7",
            "after {head:?}"
        );
    }
    // A nested block mapping's duplicate keeps the parser's position.
    let e = err("# gw.yaml\nauth: none\nlimits:\n  maxConnections: 1\n  maxConnections: 2\n");
    assert!(
        e.contains("duplicate field `maxConnections` at line 4 column 3"),
        "{e}"
    );
}

#[test]
fn concurrency_limits_default_per_model_and_can_be_overridden() {
    let c = GatewayConfig::from_yaml(
        "auth: none\nlimits: { maxConcurrentRequests: 8 }\nmodels:\n  - name: a\n  - name: b\n    limits: { maxConcurrentRequests: 2 }\n",
    )
    .unwrap();
    assert_eq!(c.max_concurrent_requests(&c.models[0]), Some(8));
    assert_eq!(c.max_concurrent_requests(&c.models[1]), Some(2));
    let c = GatewayConfig::from_yaml(GOOD).unwrap();
    assert_eq!(c.max_concurrent_requests(&c.models[0]), None);
}

#[test]
fn a_zero_concurrency_limit_is_rejected_with_the_model_and_line() {
    let e = err("models:\n  - name: a\n  - name: b\n    limits: { maxConcurrentRequests: 0 }\n");
    assert!(e.contains("model `b`"), "{e}");
    assert!(e.contains("maxConcurrentRequests"), "{e}");
    // A model's own checks run once the model is read: serde_yaml places them at its list.
    assert!(e.contains("line 2"), "{e}");
    let e = err("limits: { maxConcurrentRequests: 0 }\nmodels:\n  - name: a\n");
    assert!(
        e.contains("`limits.maxConcurrentRequests` must be at least 1"),
        "{e}"
    );
    let e = err("models:\n  - name: a\n    limits: { maxConcurrentRequests: -1 }\n");
    assert!(e.contains("models[0].limits.maxConcurrentRequests"), "{e}");
}

#[test]
fn a_zero_band_limit_names_the_band_and_the_limit() {
    let e = err("flowControl: { bands: { standard: { maxBytes: 0 } } }\nmodels:\n  - name: a\n");
    assert!(
        e.contains("`flowControl.bands.standard.maxBytes` must be at least 1"),
        "{e}"
    );
    let e = err("flowControl: { bands: { critical: { maxRequests: 0 } } }\nmodels:\n  - name: a\n");
    assert!(
        e.contains("`flowControl.bands.critical.maxRequests` must be at least 1"),
        "{e}"
    );
}

#[test]
fn a_flow_queue_as_large_as_the_in_flight_limit_is_refused_naming_both() {
    let e = err(
        "limits: { maxRequestsInFlight: 100 }\nflowControl: { enabled: true, maxRequests: 100 }\nmodels:\n  - name: a\n",
    );
    assert!(
        e.contains(
            "`flowControl.maxRequests` (100) must be below `limits.maxRequestsInFlight` (100)"
        ),
        "{e}"
    );
    // The defaults fit each other; a queue left off is not checked.
    let ok =
        |text: &str| GatewayConfig::from_yaml(&format!("{text}auth: none\nmodels:\n  - name: a\n"));
    let c = ok("flowControl: { enabled: true }\n").unwrap();
    assert!((c.flow_control.max_requests as usize) < c.limits.max_requests_in_flight);
    ok("limits: { maxRequestsInFlight: 100 }\nflowControl: { enabled: true, maxRequests: 99 }\n")
        .unwrap();
    ok("limits: { maxRequestsInFlight: 100 }\nflowControl: { enabled: false }\n").unwrap();
}

#[test]
fn listen_and_admin_on_one_port_are_refused_naming_both() {
    let models = "models:\n  - name: a\n";
    for (listen, admin) in [
        ("127.0.0.1:9090", "127.0.0.1:9090"),
        ("0.0.0.0:9090", "127.0.0.1:9090"),
        ("127.0.0.1:8080", "0.0.0.0:8080"),
        ("'[::]:8080'", "127.0.0.1:8080"),
    ] {
        let e = err(&format!("listen: {listen}\nadmin: {admin}\n{models}"));
        assert!(e.contains("`listen`") && e.contains("`admin`"), "{e}");
    }
    // The default admin address, taken by the front door.
    let e = err(&format!("listen: 127.0.0.1:9090\n{models}"));
    assert!(
        e.contains("`listen` (127.0.0.1:9090) and `admin` (127.0.0.1:9090) both take port 9090"),
        "{e}"
    );
    // Different ports, different IPs on one port, or port 0 (a free port each) can all be bound.
    for (listen, admin) in [
        ("127.0.0.1:8080", "127.0.0.1:9090"),
        ("127.0.0.1:9090", "127.0.0.2:9090"),
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("0.0.0.0:0", "127.0.0.1:0"),
    ] {
        let text = format!("listen: {listen}\nadmin: {admin}\nauth: none\n{models}");
        assert!(GatewayConfig::from_yaml(&text).is_ok(), "{listen} {admin}");
    }
}

/// The messages of `e` and of each of its causes, outermost first.
fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_refused_file_s_error_chain_says_each_thing_once() {
    let missing =
        GatewayConfig::from_file(Path::new("/nonexistent/infergate/gateway.yaml")).unwrap_err();
    let invalid = GatewayConfig::from_yaml("models: [\n").unwrap_err();
    for e in [
        crate::Error::from(missing),
        crate::Error::from(invalid),
        crate::Error::Io(std::io::Error::other("address in use")),
    ] {
        let messages = chain(&e);
        assert!(messages.len() >= 2, "{messages:?}");
        for (i, outer) in messages.iter().enumerate() {
            for inner in &messages[i + 1..] {
                assert!(
                    !outer.contains(inner.as_str()),
                    "`{outer}` repeats its cause `{inner}`: {messages:?}"
                );
            }
        }
    }
}

#[test]
fn without_auth_quotas_and_rewrites_for_named_tenants_are_refused() {
    let models = "models:\n  - name: m\n  - name: n\n";
    let parse = |auth: &str, rest: &str| GatewayConfig::from_yaml(&format!("{auth}{models}{rest}"));
    let none = "auth: none\n";
    let keys = "auth:\n  apiKeys: { keys: [{ sha256: \
                9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, tenant: team-a, \
                models: [\"*\"] }] }\n";
    let quota = "quotas:\n  tenants: { anonymous: { requestsPerMinute: 5 }, team-a: { requestsPerMinute: 9 } }\n";
    let rewrite = "rewrites:\n  - matches: [{ model: { value: m } }]\n    tenants: [team-a]\n    \
                   targets: [{ modelRewrite: n }]\n";
    let header = "tenancy: { tenantHeader: x-tenant }\n";
    for (rest, field) in [
        (format!("{quota}{header}"), "`quotas.tenants.team-a`"),
        (quota.to_owned(), "`quotas.tenants.team-a`"),
        (format!("{rewrite}{header}"), "`rewrites[0].tenants`"),
    ] {
        let e = parse(none, &rest).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
        assert!(
            e.contains("every request is the tenant `anonymous` for quotas and rewrites")
                && e.contains(
                    "`tenancy.tenantHeader` names the tenant for flow-control fairness only"
                )
                && e.contains("auth.apiKeys"),
            "{e}"
        );
        // Authenticated, the same sections name real tenants.
        assert!(parse(keys, &rest).is_ok(), "{rest}");
    }
    // The tenant every request is without authentication, and limits for every tenant, stay.
    let fine = "quotas:\n  default: { requestsPerMinute: 60 }\n  tenants: { anonymous: { requestsPerMinute: 5 } }\n\
                rewrites:\n  - matches: [{ model: { value: m } }]\n    tenants: [anonymous]\n    \
                targets: [{ modelRewrite: n }]\n  - matches: [{ model: { value: n } }]\n    \
                targets: [{ modelRewrite: m }]\n";
    assert!(parse(none, &format!("{fine}{header}")).is_ok());
}

#[test]
fn precise_prefix_sizes_out_of_range_are_refused_naming_the_model_and_field() {
    let model = |fields: &str| {
        format!("models:\n  - name: m\n    precisePrefix: {{ tokenizer: /t{fields} }}\n")
    };
    GatewayConfig::from_yaml(&format!("{}auth: none\n", model(""))).unwrap();
    let e = err(&model(", maxBodyBytes: 0"));
    assert!(e.contains("model `m`"), "{e}");
    assert!(
        e.contains("maxBodyBytes must be between 1024 and 268435456 bytes, not 0"),
        "{e}"
    );
    let e = err(&model(", byteBudget: 1000"));
    assert!(e.contains("byteBudget must be between 1048576"), "{e}");
    let e = err(&model(", eventsPort: 0"));
    assert!(e.contains("eventsPort must be a port"), "{e}");
}

#[test]
fn outlier_detection_is_read_and_a_bad_value_names_the_model_and_field() {
    let c = GatewayConfig::from_yaml(
        "auth: none\nmodels:\n  - name: a\n    scheduler: { outlierDetection: { consecutive5xx: 2 } }\n  - name: b\n  - name: c\n    scheduler: { outlierDetection: null }\n  - name: d\n    scheduler: { preset: round-robin }\n",
    )
    .unwrap();
    let o = c.models[0].scheduler.outlier_detection.unwrap();
    assert_eq!((o.consecutive_5xx, o.base_ejection_ms), (2, 30_000));
    // The `infergate` preset's default is on; `null` and the baselines are off.
    assert_eq!(
        c.models[1].scheduler.outlier_detection,
        Some(infergate_scheduler::outlier::OutlierDetection::default())
    );
    assert_eq!(c.models[2].scheduler.outlier_detection, None);
    assert_eq!(c.models[3].scheduler.outlier_detection, None);
    for (bad, want) in [
        (
            "{ consecutive5xx: 0 }",
            "`outlierDetection.consecutive5xx` must be at least 1",
        ),
        (
            "{ maxEjectionPercent: 120 }",
            "`outlierDetection.maxEjectionPercent` 120 is over 100",
        ),
        (
            "{ baseEjectionMs: 9000, maxEjectionMs: 100 }",
            "`outlierDetection.maxEjectionMs` 100 is below baseEjectionMs (9000)",
        ),
    ] {
        let e = err(&format!(
            "models:\n  - name: a\n    scheduler: {{ outlierDetection: {bad} }}\n"
        ));
        assert!(e.contains("model `a`") && e.contains(want), "{bad}: {e}");
    }
    let e =
        err("models:\n  - name: a\n    scheduler: { outlierDetection: { consecutive5XX: 2 } }\n");
    assert!(e.contains("consecutive5XX"), "{e}");
}

/// A KV-event port label on an endpoint that is not a port is refused at load, naming the
/// model, the endpoint and the label (read at the pick, it was a warning, and the pod followed
/// the configured port: another engine's feed on a shared host).
#[test]
fn a_kv_event_port_label_that_is_not_a_port_is_refused() {
    for label in [
        "infergate.io/kv-events-port",
        "infergate.io/kv-events-replay-port",
    ] {
        for value in ["60o2", "0", "65536"] {
            let e = err(&format!(
                "models:\n  - name: a\n    endpoints:\n      - {{ address: 127.0.0.1:8101, labels: {{ {label}: \"{value}\" }} }}\n"
            ));
            assert!(
                e.contains("model `a`: endpoint 127.0.0.1:8101: label")
                    && e.contains(label)
                    && e.contains("1 to 65535"),
                "{label}={value}: {e}"
            );
        }
        GatewayConfig::from_yaml(&format!(
            "auth: none\nmodels:\n  - name: a\n    endpoints:\n      - {{ address: 127.0.0.1:8101, labels: {{ {label}: \"6002\" }} }}\n"
        ))
        .unwrap();
    }
}
