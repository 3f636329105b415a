use super::*;

const CLUSTER: &str = "clusters:\n  - { name: a, url: 'http://127.0.0.1:8080', region: r1, cost: { inputPerMillion: 0.1, outputPerMillion: 0.4 } }\n";

fn err(yaml: &str) -> String {
    match GlobalConfig::from_yaml(yaml) {
        Ok(_) => panic!("accepted: {yaml}"),
        Err(ConfigError::Parse { source }) => source.to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_minimal_file_takes_the_defaults() {
    let c = GlobalConfig::from_yaml(&format!("auth: none\n{CLUSTER}")).unwrap();
    assert_eq!(c.heartbeat, HeartbeatConfig::default());
    assert_eq!(c.heartbeat.interval(), Duration::from_secs(1));
    assert_eq!(c.routing.policy, Policy::CostAware);
    assert_eq!(c.routing.ttft_objective_ms, 2_000);
    assert_eq!(c.retries.max_attempts, 3);
    assert_eq!(c.reload_interval_ms, 1_000);
    assert_eq!(c.clusters[0].cost.per_token(), (0.1 / 1e6, 0.4 / 1e6));
    // 0 turns reloading off, as on the gateway.
    let off = GlobalConfig::from_yaml(&format!("auth: none\nreloadIntervalMs: 0\n{CLUSTER}"));
    assert_eq!(off.unwrap().reload_interval_ms, 0);
}

#[test]
fn quotas_and_tenancy_are_the_gateways_sections() {
    let c = GlobalConfig::from_yaml(&format!(
        "auth: none\ntenancy: {{ tenantHeader: x-tenant }}\nquotas:\n  tenants: {{ team: {{ requestsPerMinute: 60 }} }}\n  redis: {{ address: '127.0.0.1:6379' }}\n{CLUSTER}"
    ))
    .unwrap();
    assert_eq!(c.tenancy.tenant_header.as_deref(), Some("x-tenant"));
    let q = c.quotas.unwrap().to_config().unwrap();
    assert_eq!(q.tenants.len(), 1);
    assert!(q.redis.is_some());
}

/// A file without `auth` says how to write one, `auth: none` included (it said only
/// ``missing field `auth` ``).
#[test]
fn auth_is_required() {
    let e = err(CLUSTER);
    assert!(
        e.starts_with("auth: is required") && e.contains("`auth: none`"),
        "{e}"
    );
    let e = err("auth: none\n");
    assert!(e.starts_with("clusters: is required"), "{e}");
}

/// A top-level key given twice (a section appended to a file that had it, the common reload
/// mistake) names the line of the second, as the gateway's loader does: the parser's message
/// was only ``duplicate field `clusters` ``. A nested duplicate keeps the parser's own position.
#[test]
fn a_top_level_key_given_twice_names_the_line_of_the_second() {
    let text = format!("auth: none\n{CLUSTER}heartbeat: {{ intervalMs: 500 }}\n{CLUSTER}");
    let e = GlobalConfig::from_yaml(&text).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the top-level key `clusters` is given twice, the second time at line 5"
    );
    let cause = std::error::Error::source(&e).map(ToString::to_string);
    assert_eq!(cause.as_deref(), Some("duplicate field `clusters`"));
    let e = err(&format!("auth: none\n'auth' : none\n{CLUSTER}"));
    assert_eq!(
        e,
        "the top-level key `auth` is given twice, the second time at line 2"
    );
    // After a leading comment (docs/global.md's file starts with one) the parser names the
    // mapping's start instead of nothing: the second key is named all the same.
    let e = err(&format!("# global.yaml\n{text}"));
    assert_eq!(
        e,
        "the top-level key `clusters` is given twice, the second time at line 6"
    );
    let e = err(&format!(
        "auth: none\nheartbeat: {{ intervalMs: 500, intervalMs: 600 }}\n{CLUSTER}"
    ));
    assert!(
        e.contains("duplicate field `intervalMs`") && e.contains("line 2"),
        "{e}"
    );
}

/// A required section misspelt is the unknown field it is, with the fields expected: it was
/// "clusters: is required", which sends the reader looking for a section they wrote.
#[test]
fn a_misspelt_required_section_is_named_as_unknown() {
    let e = err(&format!(
        "auth: none\n{}",
        CLUSTER.replacen("clusters:", "cluster:", 1)
    ));
    assert!(
        e.contains("unknown field `cluster`") && e.contains("`clusters`"),
        "{e}"
    );
    let e = err(&format!("auht: none\n{CLUSTER}"));
    assert!(
        e.contains("unknown field `auht`") && e.contains("`auth`"),
        "{e}"
    );
}

#[test]
fn gpu_hour_prices_every_token_alike() {
    let c = GlobalConfig::from_yaml(
        "auth: none\nclusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { gpuHour: 3.6, tokensPerSecond: 1000 } }\n",
    )
    .unwrap();
    let (i, o) = c.clusters[0].cost.per_token();
    assert!(
        (i - 1e-6).abs() < 1e-15 && (o - 1e-6).abs() < 1e-15,
        "{i} {o}"
    );
}

#[test]
fn bad_values_name_their_field() {
    let cases = [
        ("clusters: []\n", "clusters: at least one cluster is needed"),
        (
            "clusters:\n  - { name: a, url: 'ftp://h:1', region: r, cost: { gpuHour: 1, tokensPerSecond: 1 } }\n",
            "clusters[0].url: must start with http:// or https://",
        ),
        (
            "clusters:\n  - { name: a, url: 'h:1', region: r, cost: { gpuHour: 1, tokensPerSecond: 1 } }\n",
            "clusters[0].url: must start with http://",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 }, tls: { caFile: ca.pem } }\n",
            "clusters[0].tls: applies to https:// URLs",
        ),
        (
            "clusters:\n  - { name: a, url: 'https://h', region: r, cost: { inputPerMillion: 1 }, tls: {} }\n",
            "clusters[0].tls: give caFile, serverName and/or certFile with keyFile",
        ),
        (
            "clusters:\n  - { name: a, url: 'https://h', region: r, cost: { inputPerMillion: 1 }, tls: { certFile: c.pem } }\n",
            "clusters[0].tls.keyFile: is missing: certFile needs the key of its certificate",
        ),
        (
            "clusters:\n  - { name: a, url: 'https://h', region: r, cost: { inputPerMillion: 1 }, tls: { keyFile: k.pem } }\n",
            "clusters[0].tls.certFile: is missing: keyFile needs the certificate",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 }, tls: { certFile: c.pem, keyFile: k.pem } }\n",
            "clusters[0].tls: applies to https:// URLs",
        ),
        (
            "clusters:\n  - { name: a, url: 'https://h', region: r, cost: { inputPerMillion: 1 }, tls: { serverName: 'a b' } }\n",
            "clusters[0].tls.serverName: is neither a DNS name nor an IP address",
        ),
        (
            "clusters:\n  - { name: a, url: 'https://h', region: r, cost: { inputPerMillion: 1 }, tls: { cafile: ca.pem } }\n",
            "unknown field `cafile`",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { gpuHour: 1, inputPerMillion: 1 } }\n",
            "clusters[0].cost: give inputPerMillion",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { gpuHour: 1, tokensPerSecond: 0 } }\n",
            "clusters[0].cost: gpuHour needs tokensPerSecond",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: -1 } }\n",
            "clusters[0].cost: prices must be finite",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 } }\n  - { name: a, url: 'http://h:2', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[1].name: is used by another cluster",
        ),
        (
            &format!("heartbeat: {{ intervalMs: 5000, staleAfterMs: 1000 }}\n{CLUSTER}"),
            "heartbeat.staleAfterMs: must be at least heartbeat.intervalMs",
        ),
        (
            &format!("retries: {{ maxAttempts: 0 }}\n{CLUSTER}"),
            "retries.maxAttempts: must be at least 1",
        ),
        (
            &format!("routing: {{ objectiveHeader: 'a b' }}\n{CLUSTER}"),
            "routing.objectiveHeader: is not a valid header name",
        ),
        (
            &format!("routing: {{ polcy: latency }}\n{CLUSTER}"),
            "unknown field `polcy`",
        ),
        (
            &format!("quotas: {{ tenants: {{ a: {{ requestsPerMinute: 0 }} }} }}\n{CLUSTER}"),
            "quotas.tenants.a",
        ),
        (
            &format!("quotas: {{ redis: {{ address: 'h:1', syncIntervalMs: 1 }} }}\n{CLUSTER}"),
            "quotas.redis.syncIntervalMs",
        ),
        (
            &format!("tenancy: {{ tenantHeader: 'a b' }}\n{CLUSTER}"),
            "tenancy.tenantHeader",
        ),
        (
            &format!("limits: {{ maxRequestsInFlight: 0 }}\n{CLUSTER}"),
            "limits.maxRequestsInFlight: must be above zero",
        ),
        (
            &format!("limits: {{ maxConnections: 0 }}\n{CLUSTER}"),
            "limits.maxConnections: must be above zero",
        ),
        (
            &format!("limits: {{ maxBufferedRequestBytes: 0 }}\n{CLUSTER}"),
            "limits.maxBufferedRequestBytes: must be above zero",
        ),
        (
            &format!("limits: {{ bodyReadTimeoutMs: 0 }}\n{CLUSTER}"),
            "limits.bodyReadTimeoutMs: must be above zero",
        ),
        (
            &format!("limits: {{ http2: {{ maxConcurrentStreams: 0 }} }}\n{CLUSTER}"),
            "limits.http2.maxConcurrentStreams: must be above zero",
        ),
        (
            &format!("limits: {{ maxHeaderBytes: 4096 }}\n{CLUSTER}"),
            "limits.maxHeaderBytes: is 4096, below the least that can be enforced, 8192 (8 KiB)",
        ),
        (
            &format!("limits: {{ maxHeaderBytes: 16777217 }}\n{CLUSTER}"),
            "limits.maxHeaderBytes: is 16777217, above the most accepted, 16777216 (16 MiB)",
        ),
        (
            &format!("timeouts: {{ firstByteMs: 18446744073709551615 }}\n{CLUSTER}"),
            "timeouts.firstByteMs: must be at most 604800000",
        ),
        (
            &format!("heartbeat: {{ slowStartMs: 18446744073709551615 }}\n{CLUSTER}"),
            "heartbeat.slowStartMs: must be at most 604800000",
        ),
        (
            &format!("reloadIntervalMs: 604800001\n{CLUSTER}"),
            "reloadIntervalMs: must be at most 604800000",
        ),
        (
            &format!("routing: {{ tenantObjectives: {{ team-a: 0 }} }}\n{CLUSTER}"),
            "routing.tenantObjectives.team-a: must be above zero",
        ),
        (
            &format!("routing: {{ tenantObjectives: {{ team-a: 604800001 }} }}\n{CLUSTER}"),
            "routing.tenantObjectives.team-a: must be at most 604800000",
        ),
        (
            "clusters:\n  - { name: 'a\"b', url: 'http://h:1', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].name: use at most 63 letters, digits",
        ),
        (
            "clusters:\n  - { name: \"a\\nb\", url: 'http://h:1', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].name: use at most 63",
        ),
        (
            &format!(
                "clusters:\n  - {{ name: {}, url: 'http://h:1', region: r, cost: {{ inputPerMillion: 1 }} }}\n",
                "a".repeat(64)
            ),
            "clusters[0].name: use at most 63",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 }, models: [] }\n",
            "clusters[0].models: lists no model",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 }, models: [m, ''] }\n",
            "clusters[0].models[1]: must not be empty",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1/p?x=1', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].url: must not have a query",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1/v1', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].url: ends in /v1",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1/team/v1/', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].url: ends in /v1",
        ),
        (
            "clusters:\n  - { name: a, url: 'http://h:1', heartbeatUrl: 'http://h:2/heartbeat?x', region: r, cost: { inputPerMillion: 1 } }\n",
            "clusters[0].heartbeatUrl: must not have a query",
        ),
        (
            &format!("listen: 127.0.0.1:9000\nadmin: 127.0.0.1:9000\n{CLUSTER}"),
            "admin: `listen` (127.0.0.1:9000) and `admin` (127.0.0.1:9000) both take port 9000",
        ),
        (
            &format!("listen: 0.0.0.0:9000\nadmin: 127.0.0.1:9000\n{CLUSTER}"),
            "both take port 9000",
        ),
    ];
    for (yaml, want) in cases {
        let got = err(&format!("auth: none\n{yaml}"));
        assert!(got.contains(want), "{yaml}: got {got}, want {want}");
    }
}

/// A path prefix is kept (and may contain `v1` elsewhere); only a trailing `/v1`, which every
/// request's own path repeats, is refused.
#[test]
fn a_url_prefix_is_kept() {
    for url in ["http://h:1/team", "http://h:1/v1x", "http://h:1/v1/team"] {
        GlobalConfig::from_yaml(&format!(
            "auth: none\nclusters:\n  - {{ name: a, url: '{url}', region: r, cost: {{ inputPerMillion: 1 }} }}\n"
        ))
        .unwrap();
    }
}

/// A name that works as a metric label and a header value passes.
#[test]
fn cluster_names_of_letters_digits_and_punctuation_pass() {
    let c = GlobalConfig::from_yaml(
        "auth: none\nclusters:\n  - { name: us-east-1.gw_a, url: 'http://h:1', region: r, cost: { inputPerMillion: 1 } }\n",
    )
    .unwrap();
    assert_eq!(c.clusters[0].name, "us-east-1.gw_a");
}

/// The admin port has no authentication: by default it listens on loopback only.
#[test]
fn the_admin_port_is_on_loopback_by_default() {
    let c = GlobalConfig::from_yaml(&format!("auth: none\n{CLUSTER}")).unwrap();
    assert_eq!(c.admin, "127.0.0.1:9091".parse().unwrap());
}

/// The command line's `--listen` and `--admin` are checked as the file's pair is; port 0 (a
/// free port each) and different IPs on one port pass.
#[test]
fn overridden_addresses_are_checked_like_the_files() {
    let mut c = GlobalConfig::from_yaml(&format!("auth: none\n{CLUSTER}")).unwrap();
    let e = c
        .set_addresses(Some("127.0.0.1:9091".parse().unwrap()), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("both take port 9091"), "{e}");
    c.set_addresses(
        Some("127.0.0.1:0".parse().unwrap()),
        Some("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    c.set_addresses(
        Some("127.0.0.2:9000".parse().unwrap()),
        Some("127.0.0.1:9000".parse().unwrap()),
    )
    .unwrap();
    assert_eq!(c.listen, "127.0.0.2:9000".parse().unwrap());
}

/// The quota service's and tenancy's own errors already name their field: it is said once.
#[test]
fn section_errors_name_their_field_once() {
    for (yaml, field) in [
        (
            format!("quotas: {{ tenants: {{ a: {{ requestsPerMinute: 0 }} }} }}\n{CLUSTER}"),
            "quotas.tenants.a",
        ),
        (
            format!("tenancy: {{ tenantHeader: 'a b' }}\n{CLUSTER}"),
            "tenancy.tenantHeader",
        ),
    ] {
        let got = err(&format!("auth: none\n{yaml}"));
        assert!(got.contains(field), "{got}");
        let section = field.split('.').next().unwrap_or(field);
        assert_eq!(got.matches(section).count(), 1, "{got}");
    }
}

#[test]
fn outlier_detection_defaults_and_overrides() {
    let c = GlobalConfig::from_yaml(&format!("auth: none\n{CLUSTER}")).unwrap();
    assert_eq!(c.outlier_detection, OutlierDetection::default());
    assert_eq!(c.outlier_detection.consecutive_gateway_failures, 5);
    assert_eq!(c.outlier_detection.base_ejection(), Duration::from_secs(30));
    assert_eq!(c.outlier_detection.max_ejection(), Duration::from_secs(300));
    assert_eq!(c.outlier_detection.max_ejection_percent, 50);
    let c = GlobalConfig::from_yaml(&format!(
        "auth: none\noutlierDetection: {{ consecutiveGatewayFailures: 3, baseEjectionMs: 1000, maxEjectionMs: 1000, maxEjectionPercent: 0 }}\n{CLUSTER}"
    ))
    .unwrap();
    assert_eq!(
        c.outlier_detection,
        OutlierDetection {
            consecutive_gateway_failures: 3,
            base_ejection_ms: 1_000,
            max_ejection_ms: 1_000,
            max_ejection_percent: 0,
            failure_percentage: None,
        }
    );
    // `failurePercentage: {}` turns it on with its defaults.
    let c = GlobalConfig::from_yaml(&format!(
        "auth: none\noutlierDetection: {{ failurePercentage: {{}} }}\n{CLUSTER}"
    ))
    .unwrap();
    assert_eq!(
        c.outlier_detection.failure_percentage,
        Some(crate::config::FailurePercentage {
            threshold: 50,
            minimum_requests: 20,
            interval_ms: 10_000,
        })
    );
}

/// Each value outlier detection cannot use is its own error, naming the field once.
#[test]
fn outlier_detection_refuses_what_it_cannot_use() {
    for (section, want) in [
        (
            "{ consecutiveGatewayFailures: 0 }",
            OutlierError::NoFailures,
        ),
        (
            "{ baseEjectionMs: 0 }",
            OutlierError::ZeroDuration(OutlierField::BaseEjectionMs),
        ),
        (
            "{ maxEjectionMs: 0 }",
            OutlierError::ZeroDuration(OutlierField::MaxEjectionMs),
        ),
        (
            "{ baseEjectionMs: 604800001, maxEjectionMs: 604800001 }",
            OutlierError::OverAWeek(OutlierField::BaseEjectionMs),
        ),
        (
            "{ maxEjectionMs: 604800001 }",
            OutlierError::OverAWeek(OutlierField::MaxEjectionMs),
        ),
        (
            "{ baseEjectionMs: 60000, maxEjectionMs: 30000 }",
            OutlierError::MaxBelowBase {
                max_ms: 30_000,
                base_ms: 60_000,
            },
        ),
        (
            "{ maxEjectionPercent: 101 }",
            OutlierError::PercentOver100(101),
        ),
        (
            "{ failurePercentage: { threshold: 0 } }",
            OutlierError::ThresholdOutOfRange(0),
        ),
        (
            "{ failurePercentage: { threshold: 101 } }",
            OutlierError::ThresholdOutOfRange(101),
        ),
        (
            "{ failurePercentage: { minimumRequests: 0 } }",
            OutlierError::NoMinimumRequests,
        ),
        (
            "{ failurePercentage: { intervalMs: 0 } }",
            OutlierError::ZeroDuration(OutlierField::IntervalMs),
        ),
        (
            "{ failurePercentage: { intervalMs: 604800001 } }",
            OutlierError::OverAWeek(OutlierField::IntervalMs),
        ),
    ] {
        let yaml = format!("auth: none\noutlierDetection: {section}\n{CLUSTER}");
        match GlobalConfig::from_yaml(&yaml) {
            Err(ConfigError::OutlierDetection(got)) => {
                assert_eq!(got, want, "{section}");
                let text = ConfigError::from(got).to_string();
                assert!(text.starts_with("outlierDetection."), "{text}");
                assert_eq!(text.matches("outlierDetection").count(), 1, "{text}");
            }
            other => panic!("{section}: {other:?}"),
        }
    }
    assert_eq!(
        OutlierError::MaxBelowBase {
            max_ms: 30_000,
            base_ms: 60_000
        }
        .to_string(),
        "outlierDetection.maxEjectionMs: 30000 is below baseEjectionMs (60000), the first ejection's length"
    );
    let e = err(&format!(
        "auth: none\noutlierDetection: {{ maxEjectionPercent: -1 }}\n{CLUSTER}"
    ));
    assert!(e.contains("maxEjectionPercent"), "{e}");
    let e = err(&format!(
        "auth: none\noutlierDetection: {{ failurePercentage: {{ thresold: 50 }} }}\n{CLUSTER}"
    ));
    assert!(e.contains("thresold"), "{e}");
    let e = err(&format!(
        "auth: none\noutlierDetection: {{ consecutive5xx: 3 }}\n{CLUSTER}"
    ));
    assert!(e.contains("unknown field `consecutive5xx`"), "{e}");
}

/// Every `global.yaml` docs/global.md shows (its YAML blocks with `clusters:`, the Helm values
/// apart) is valid, so that a new user copying one starts from a file the router takes.
#[test]
fn the_documented_files_are_valid() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/global.md"))
        .unwrap();
    let mut checked = 0;
    for block in doc.split("```yaml\n").skip(1) {
        let block = block.split("```").next().unwrap();
        if !block.contains("\nclusters:") || block.contains("globalRouter:") {
            continue;
        }
        // The variable the example names is not set here; one that is stands in for it.
        let block = block.replace("passwordEnv: REDIS_PASSWORD", "passwordEnv: PATH");
        if let Err(e) = GlobalConfig::from_yaml(&block) {
            panic!(
                "{e}: {:?}\n{block}",
                std::error::Error::source(&e).map(ToString::to_string)
            );
        }
        checked += 1;
    }
    assert!(checked >= 2, "{checked} documented files found");
}

/// Without authentication and without `tenancy.tenantHeader` every request is the tenant
/// `default`: a quota or an objective for another tenant never applies. It passed, leaving
/// that tenant unlimited; it is refused (as the gateway refuses its equivalent), naming how to
/// name tenants. With a tenant header, with authentication, or for `default` itself, it passes.
#[test]
fn a_tenant_no_request_can_be_is_refused() {
    let quotas = "quotas: { tenants: { team-a: { requestsPerMinute: 5 } } }\n";
    let objectives = "routing: { tenantObjectives: { team-a: 500 } }\n";
    for (section, field) in [
        (quotas, "quotas.tenants.team-a"),
        (objectives, "routing.tenantObjectives.team-a"),
    ] {
        let e = err(&format!("auth: none\n{section}{CLUSTER}"));
        assert!(
            e.starts_with(field) && e.contains("`default`") && e.contains("tenantHeader"),
            "{e}"
        );
        GlobalConfig::from_yaml(&format!(
            "auth: none\ntenancy: {{ tenantHeader: x-tenant }}\n{section}{CLUSTER}"
        ))
        .unwrap();
        GlobalConfig::from_yaml(&format!(
            "auth: {{ apiKeys: {{ keys: [{{ sha256: {}, tenant: t, models: ['*'] }}] }} }}\n{section}{CLUSTER}",
            "0".repeat(64)
        ))
        .unwrap();
    }
    GlobalConfig::from_yaml(&format!(
        "auth: none\nquotas: {{ tenants: {{ default: {{ requestsPerMinute: 5 }} }} }}\n{CLUSTER}"
    ))
    .unwrap();
}

#[test]
fn https_clusters_default_to_port_443_and_take_tls() {
    let c = GlobalConfig::from_yaml(
        "auth: none\nclusters:\n  - { name: a, url: 'https://gw.example.com/prefix', heartbeatUrl: 'https://gw.example.com:9443/heartbeat', region: r, cost: { inputPerMillion: 1 }, tls: { caFile: /etc/ca.pem, serverName: gw.internal } }\n  - { name: b, url: 'http://[::1]', region: r, cost: { inputPerMillion: 1 } }\n",
    )
    .unwrap();
    let a = &c.clusters[0];
    let url = parse_url(&a.url).unwrap();
    assert_eq!(port_of(&url), 443);
    assert_eq!(url.path(), "/prefix");
    assert_eq!(
        port_of(&parse_url(a.heartbeat_url.as_deref().unwrap()).unwrap()),
        9443
    );
    assert_eq!(
        a.tls,
        Some(ClusterTls {
            ca_file: Some(PathBuf::from("/etc/ca.pem")),
            server_name: Some("gw.internal".into()),
            cert_file: None,
            key_file: None,
        })
    );
    let b = parse_url(&c.clusters[1].url).unwrap();
    assert_eq!(port_of(&b), 80);
    assert!(is_loopback(&b));
    // An http:// URL with an https:// heartbeat may verify the heartbeat's certificate.
    GlobalConfig::from_yaml(
        "auth: none\nclusters:\n  - { name: a, url: 'http://10.0.0.1:8080', heartbeatUrl: 'https://10.0.0.1:9443/heartbeat', region: r, cost: { inputPerMillion: 1 }, tls: { serverName: gw.internal } }\n",
    )
    .unwrap();
    for (host, loopback) in [
        ("http://localhost:1", true),
        ("http://127.0.0.2:1", true),
        ("http://10.0.0.1:1", false),
        ("https://gw.example.com", false),
    ] {
        assert_eq!(is_loopback(&parse_url(host).unwrap()), loopback, "{host}");
    }
}

/// `listen: 8080` (a port alone) or a host name was refused as "invalid socket address syntax",
/// which does not say what to write.
#[test]
fn an_address_that_is_not_ip_and_port_says_what_to_write() {
    for (value, shown) in [("8080", "`8080`"), ("'localhost:8080'", "`localhost:8080`")] {
        for field in ["listen", "admin"] {
            let e = err(&format!("auth: none\n{field}: {value}\n{CLUSTER}"));
            assert!(
                e.starts_with(&format!("{field}: {shown} is not an address"))
                    && e.contains("e.g. 0.0.0.0:8080"),
                "{e}"
            );
        }
    }
    let c =
        GlobalConfig::from_yaml(&format!("auth: none\nlisten: '[::1]:8080'\n{CLUSTER}")).unwrap();
    assert_eq!(c.listen.to_string(), "[::1]:8080");
}
