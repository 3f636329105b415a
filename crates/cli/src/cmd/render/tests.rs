#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use infergate_api::InferenceGatewayConfig;
use infergate_api::validation::{self, Violation};

use super::*;

/// `render` of `text` (no `--namespace`), which must fail; its message with every cause.
fn refused(text: &str) -> String {
    match render_documents(text, &RenderOptions::default(), None) {
        Ok(out) => panic!("rendered:\n{text}\nas\n{out}"),
        Err(e) => format!("{e:#}"),
    }
}

const HEAD: &str = "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\n";

/// The walkthrough's files (target/walk-b), each of which rendered with exit 0 before the
/// CRD's schema was applied, and what the message must say about it.
const WALKTHROUGH: &[(&str, &str, &[&str])] = &[
    (
        "w-typo.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
    - name: a
      modelName: m
      modelSelector: {app: a}
      loraAdpaters: [sql]
      weights: {queue: 1, latency: 5}
",
        &[
            "InferenceGatewayConfig ns/t (document 1) does not pass the CRD's schema",
            "spec.schedulers[0].loraAdpaters: unknown field: the API server would drop it",
            "did you mean loraAdapters?",
            "spec.schedulers[0].weights.latency: unknown field",
        ],
    ),
    (
        "v-unknown-field.yaml",
        "metadata:
  name: t
  namespace: ns
spec:
  allowUnauthenticated: true
  schedulers:
  - name: a
    modelName: m1
    modelSelector:
      app: a
    bogus: 1
  foo: bar
",
        &[
            "spec.foo: unknown field: the API server would drop it",
            "spec.schedulers[0].bogus: unknown field",
        ],
    ),
    (
        "v-weights-unknown.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
  - name: a
    modelName: m1
    modelSelector: {app: a}
    weights:
      queue: 1
      latency: 2
",
        &["spec.schedulers[0].weights.latency: unknown field"],
    ),
    (
        "v-bad-port.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
  - name: a
    modelName: m1
    modelSelector: {app: a}
    targetPort: 70000
",
        &["spec.schedulers[0].targetPort: must be at most 65535 (is 70000)"],
    ),
    (
        "v-bad-name.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
  - name: A_b
    modelName: m1
    modelSelector:
      app: A_b
",
        &[r#"spec.schedulers[0].name: "A_b" is not a DNS label"#],
    ),
    (
        "v-bad-timeout.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
  - name: a
    modelName: m1
    modelSelector: {app: a}
    routeTimeout: 5 minutes
",
        &[r#"spec.schedulers[0].routeTimeout: "5 minutes" is not a Gateway API duration"#],
    ),
    (
        "v-modelname-empty.yaml",
        "metadata: {name: t, namespace: ns}
spec:
  allowUnauthenticated: true
  schedulers:
  - name: a
    modelName: ''
    modelSelector: {app: a}
",
        &["spec.schedulers[0].modelName: must not be empty"],
    ),
];

#[test]
fn the_walkthroughs_files_are_refused_naming_the_field_and_the_problem() {
    for (file, body, wants) in WALKTHROUGH {
        let err = refused(&format!("{HEAD}{body}"));
        for want in *wants {
            assert!(err.contains(want), "{file}: {want:?} not in\n{err}");
        }
    }
}

#[test]
fn the_api_version_must_be_the_crds() {
    let body = "metadata: {name: llama, namespace: inference}
spec:
  allowUnauthenticated: true
  schedulers:
    - name: llama-8b
      modelName: meta-llama/Llama-3.1-8B-Instruct
      modelSelector: {app: vllm-llama-8b}
";
    // wrongver.yaml, another group's version, and none at all.
    for (api_version, want) in [
        (
            "apiVersion: infergate.dev/v1\n",
            r#"apiVersion: is "infergate.dev/v1", but the CRD serves infergate.dev/v1alpha1"#,
        ),
        (
            "apiVersion: example.com/v9\n",
            r#"apiVersion: is "example.com/v9", but the CRD serves infergate.dev/v1alpha1"#,
        ),
        (
            "",
            "apiVersion: is missing: set it to infergate.dev/v1alpha1",
        ),
    ] {
        let err = refused(&format!(
            "{api_version}kind: InferenceGatewayConfig\n{body}"
        ));
        assert!(err.contains(want), "{api_version:?}: {err}");
    }
    // A misspelt kind of our group is not skipped as someone else's document.
    let err = refused(&format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayconfig\n{body}"
    ));
    assert!(
        err.contains(
            r#"document 1: infergate.dev/v1alpha1 has no kind "InferenceGatewayconfig": the CRD defines InferenceGatewayConfig"#
        ),
        "{err}"
    );
}

#[test]
fn every_example_renders() {
    for path in infergate_testkit::example_configs("") {
        let text = std::fs::read_to_string(&path).unwrap();
        render_documents(&text, &RenderOptions::default(), None)
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    }
}

/// Each invalid example fails with the message docs/configuration.md gives for the rule it
/// breaks (the CEL table, or the operator's checks with the field's path).
#[test]
fn every_invalid_example_fails_with_its_documented_message() {
    let documented: &[(&str, &str)] = &[
        (
            "all-zero-weights.yaml",
            "at least one scorer weight must be greater than zero, otherwise every pod scores the same",
        ),
        (
            "bbr-disabled-two-models.yaml",
            "spec.bbr.enabled must be true when more than one scheduler is configured",
        ),
        (
            "duplicate-model-name.yaml",
            "each scheduler must have a different modelName: two schedulers cannot serve the same model",
        ),
        (
            "duplicate-name.yaml",
            "each scheduler must have a different name: the name is part of its children's names",
        ),
        (
            "flow-control-zero-band.yaml",
            "spec.flowControl.bands.sheddable.maxRequests: must be at least 1",
        ),
        (
            "https-without-tls.yaml",
            "an HTTPS listener needs spec.tls (a certificate Secret or a cert-manager issuer)",
        ),
        (
            "negative-weight.yaml",
            "scorer weights must be zero or positive numbers",
        ),
        (
            "no-schedulers.yaml",
            "spec.schedulers must list between 1 and 100 schedulers",
        ),
        (
            "objective-unknown-band.yaml",
            "spec.tenancy.objectives.interactive: must be critical, standard, sheddable or an integer",
        ),
        (
            "preset-and-weights.yaml",
            "set either preset or weights on a scheduler, not both",
        ),
        (
            "redis-password-both.yaml",
            "spec.quotas.redis takes passwordEnv or passwordSecretRef, not both",
        ),
        (
            "redis-password-env-undefined.yaml",
            "spec.quotas.redis.passwordEnv: names a variable spec.podDefaults.env does not define",
        ),
        (
            "tls-both-sources.yaml",
            "spec.tls needs exactly one of certificateSecretRef and issuerRef",
        ),
        (
            "too-many-schedulers.yaml",
            "spec.schedulers must list between 1 and 100 schedulers",
        ),
    ];
    for path in infergate_testkit::example_configs("invalid") {
        let file = path.file_name().unwrap().to_str().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let err = refused(&text);
        // An example added after this table: the operator's own messages for it.
        let cfg: InferenceGatewayConfig = serde_yaml::from_str(&text).unwrap();
        let derived: Vec<String> = match validation::validate(&cfg.spec) {
            Err(infergate_api::Error::Invalid(v)) => v.iter().map(Violation::to_string).collect(),
            _ => Vec::new(),
        };
        let wants: Vec<String> = match documented.iter().find(|(f, _)| *f == file) {
            Some((_, message)) => vec![(*message).to_owned()],
            None => derived,
        };
        assert!(!wants.is_empty(), "{file}: no expected message");
        for want in &wants {
            assert!(
                err.contains(want.as_str()),
                "{file}: {want:?} not in\n{err}"
            );
        }
    }
}

#[test]
fn namespace_flag_fills_in_a_missing_namespace_and_refuses_another() {
    let text = format!(
        "{HEAD}metadata: {{name: llama}}\nspec:\n  allowUnauthenticated: true\n  schedulers:\n    - {{name: a, modelName: m, modelSelector: {{app: a}}}}\n"
    );
    let opts = RenderOptions::default();
    let err = refused(&text);
    assert!(
        err.contains("InferenceGatewayConfig llama (document 1) sets no metadata.namespace: set it in the file or pass --namespace"),
        "{err}"
    );
    let out = render_documents(&text, &opts, Some("serving")).unwrap();
    assert!(
        out.contains("# Deployment/llama-a-epp (from serving/llama)"),
        "{out}"
    );
    assert!(out.contains("namespace: serving"), "{out}");
    assert!(!out.contains("namespace: inference"), "{out}");
    // The same namespace twice is fine; another one is refused, as kubectl refuses it.
    let with_ns = text.replace("{name: llama}", "{name: llama, namespace: inference}");
    let out = render_documents(&with_ns, &opts, Some("inference")).unwrap();
    assert!(out.contains("(from inference/llama)"), "{out}");
    let err = format!(
        "{:#}",
        render_documents(&with_ns, &opts, Some("serving")).unwrap_err()
    );
    assert!(
        err.contains(r#"metadata.namespace is "inference" but --namespace is "serving""#),
        "{err}"
    );
}

#[test]
fn yaml_json_cannot_carry_is_refused() {
    let err = refused(&format!(
        "{HEAD}metadata: {{name: t, namespace: ns}}\nspec:\n  allowUnauthenticated: true\n  schedulers:\n  - name: a\n    modelName: m\n    modelSelector: {{app: a}}\n    weights: {{queue: .inf}}\n"
    ));
    assert!(
        err.contains("document 1: spec.schedulers[0].weights.queue is not a finite number"),
        "{err}"
    );
}

#[test]
fn the_document_at_fault_is_named_in_a_stream() {
    let good = std::fs::read_to_string(infergate_testkit::example_configs("")[0].clone()).unwrap();
    let bad = format!(
        "{HEAD}metadata: {{name: t, namespace: ns}}\nspec:\n  allowUnauthenticated: true\n  schedulers:\n  - {{name: a, modelName: m, modelSelector: {{app: a}}, targetPort: 0}}\n"
    );
    let err = refused(&format!(
        "{good}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: x}}\n---\n{bad}"
    ));
    assert!(
        err.contains("InferenceGatewayConfig ns/t (document 3) does not pass the CRD's schema:\n- spec.schedulers[0].targetPort: must be at least 1 (is 0)"),
        "{err}"
    );
}

/// A bound both the schema and the operator check is reported once, in the operator's words.
#[test]
fn a_field_the_schema_refuses_is_named_once() {
    let path = infergate_testkit::example_configs("invalid")
        .into_iter()
        .find(|p| p.ends_with("flow-control-zero-band.yaml"))
        .unwrap();
    let err = refused(&std::fs::read_to_string(path).unwrap());
    assert_eq!(
        err.matches("spec.flowControl.bands.sheddable.maxRequests")
            .count(),
        1,
        "{err}"
    );
}

/// Strings YAML 1.1 reads as booleans, numbers or dates (`on`, `no`, `y`, `1_000`) come out
/// quoted, keys included: kubectl and Argo CD read a plain `on` as `true`, and the API server
/// then refused the object. Everything else is written as serde_yaml writes it.
#[test]
fn strings_yaml_1_1_would_misread_are_quoted() {
    let out = render_documents(
        &format!(
            "{HEAD}metadata: {{name: t, namespace: ns}}
spec:
  allowUnauthenticated: true
  podDefaults:
    labels: {{tier: 'on'}}
    annotations: {{'off': 'No'}}
    nodeSelector: {{gpu: 'no'}}
    env: [{{name: A, value: '1_000'}}, {{name: B, value: 'y'}}, {{name: C, value: '1:20'}}, {{name: D, value: '='}}]
  schedulers:
  - {{name: a, modelName: 'yes', modelSelector: {{app: '2001-12-14'}}}}
"
        ),
        &RenderOptions::default(),
        None,
    )
    .unwrap();
    for want in [
        "tier: 'on'",
        "'off': 'No'",
        "gpu: 'no'",
        "value: '1_000'",
        "value: 'y'",
        "value: '1:20'",
        "value: '='",
        "value: 'yes'",
        "app: '2001-12-14'",
    ] {
        assert!(out.contains(want), "{want} not in\n{out}");
    }
    assert!(out.contains("value: info\n"), "plain strings stay plain");
    // Without such strings the output is serde_yaml's, byte for byte.
    let path = infergate_testkit::example_configs("")
        .into_iter()
        .find(|p| p.ends_with("single-model.yaml"))
        .unwrap();
    let cfg: InferenceGatewayConfig =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for c in render(&cfg, &RenderOptions::default()).unwrap() {
        assert_eq!(
            yaml::to_string(&c.object).unwrap(),
            serde_yaml::to_string(&c.object).unwrap()
        );
    }
}

/// Secret names as Kubernetes checks them (RFC 1123 subdomains): what `--image-pull-secret`
/// accepts.
#[test]
fn image_pull_secret_names_are_dns_subdomains() {
    for good in ["regcred", "a", "ecr-pull.v2", "0day", &"a".repeat(253)] {
        assert!(is_dns_subdomain(good), "{good:?} refused");
    }
    for bad in [
        "",
        "Regcred",
        "reg_cred",
        "-regcred",
        "regcred-",
        "reg..cred",
        ".regcred",
        "regcred.",
        "reg.-cred",
        "reg cred",
        "régcred",
        &"a".repeat(254),
    ] {
        assert!(!is_dns_subdomain(bad), "{bad:?} accepted");
    }
}

/// A name Kubernetes would refuse is refused as the flag is read, naming the flag and the
/// name, on both commands that take it; the good names before it do not hide it.
#[test]
fn a_bad_image_pull_secret_is_refused_naming_the_flag() {
    use clap::Parser as _;
    for command in [&["render", "-f", "x.yaml"][..], &["operator"]] {
        let err = crate::Cli::try_parse_from(
            ["infergate"]
                .iter()
                .chain(command)
                .chain(&["--image-pull-secret", "regcred,Bad_Name"]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(
                "invalid value 'Bad_Name' for '--image-pull-secret <NAME>': not a Secret name"
            ),
            "{command:?}: {err}"
        );
    }
    let cli = crate::Cli::try_parse_from([
        "infergate",
        "render",
        "-f",
        "x.yaml",
        "--image-pull-secret",
        "regcred,ecr.v2",
        "--image-pull-secret=third",
    ])
    .unwrap();
    let crate::Command::Render(args) = cli.command else {
        panic!("not the render command");
    };
    let mut opts = RenderOptions::default();
    args.pull.apply(&mut opts);
    assert_eq!(opts.image_pull_secrets, ["regcred", "ecr.v2", "third"]);
}
