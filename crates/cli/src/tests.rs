//! The contract between what the operator renders and what this binary accepts: every container
//! command of every example parses with this binary's own parser, its environment is accepted,
//! and every rendered ConfigMap file loads with the loader the process uses.
//! (`tests/render_run.rs` goes further and runs the rendered processes.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;

use clap::Parser as _;
use infergate_extproc::bbr::ModelsFile;
use infergate_operator::render::{RenderOptions, render};
use serde_json::Value;

use super::{Cli, Command};

fn rendered(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let cfg = serde_yaml::from_str(&text).unwrap();
    render(&cfg, &RenderOptions::default())
        .unwrap()
        .into_iter()
        .map(|c| serde_json::to_value(&c.object).unwrap())
        .collect()
}

#[test]
fn every_rendered_container_command_parses_with_this_binary() {
    let mut seen = 0;
    for path in infergate_testkit::example_configs("") {
        let objects = rendered(&path);
        for d in objects.iter().filter(|o| o["kind"] == "Deployment") {
            let pod = &d["spec"]["template"]["spec"];
            for c in pod["containers"].as_array().unwrap() {
                let mut argv = vec!["infergate".to_owned()];
                argv.extend(
                    c["args"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_str().unwrap().to_owned()),
                );
                // The environment the container gets, where a flag reads one.
                let log_format = c["env"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["name"] == "INFERGATE_LOG_FORMAT")
                    .and_then(|e| e["value"].as_str())
                    .unwrap();
                argv.push(format!("--log-format={log_format}"));
                let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| {
                    panic!("{}: {} does not parse: {e}", path.display(), argv.join(" "))
                });
                match (cli.command, c["name"].as_str().unwrap()) {
                    (Command::Picker(a), "endpoint-picker") => {
                        let config = a.config.expect("the picker reads its ConfigMap");
                        check_file(&objects, d, &config, |text| {
                            let cfg: infergate_scheduler::SchedulerConfig =
                                serde_yaml::from_str(text).unwrap();
                            cfg.validate().unwrap();
                        });
                        assert!(
                            a.endpoints_file.is_none(),
                            "Kubernetes discovery in a cluster"
                        );
                    }
                    (Command::Bbr(a), "bbr") => {
                        check_file(&objects, d, &a.models, |text| {
                            let m = ModelsFile::parse(text).unwrap();
                            assert!(!m.models.is_empty());
                            m.router().unwrap();
                        });
                    }
                    (other, name) => panic!("container {name} runs {other:?}"),
                }
                seen += 1;
            }
        }
    }
    assert!(seen >= 5, "containers checked: {seen}");
}

/// `path` (from a flag) lies under a volume mount of `deployment` whose ConfigMap, rendered in
/// `objects`, has that file; `load` gets its text.
fn check_file(objects: &[Value], deployment: &Value, path: &Path, load: impl Fn(&str)) {
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let (mount, rel) = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|m| {
            let dir = Path::new(m["mountPath"].as_str().unwrap());
            path.strip_prefix(dir).ok().map(|rel| (m, rel.to_owned()))
        })
        .unwrap_or_else(|| panic!("{} is under no volume mount", path.display()));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let cm_name = volume["configMap"]["name"].as_str().unwrap();
    let item = volume["configMap"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| Path::new(i["path"].as_str().unwrap()) == rel)
        .unwrap_or_else(|| panic!("no item of {cm_name} is mounted as {}", rel.display()));
    let cm = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == cm_name)
        .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not rendered"));
    let text = cm["data"][item["key"].as_str().unwrap()].as_str().unwrap();
    load(text);
}

#[test]
fn render_refuses_bad_input_with_the_operators_message() {
    use crate::cmd::render::render_documents;
    let opts = RenderOptions::default();
    let invalid = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/examples/invalid/negative-weight.yaml"),
    )
    .unwrap();
    let err = format!("{:#}", render_documents(&invalid, &opts, None).unwrap_err());
    assert!(
        err.contains("scorer weights must be zero or positive numbers"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        render_documents("a: [unclosed", &opts, None).unwrap_err()
    );
    assert!(err.contains("document 1 is not YAML"), "{err}");
    let err = format!(
        "{:#}",
        render_documents("kind: ConfigMap\napiVersion: v1\n", &opts, None).unwrap_err()
    );
    assert!(err.contains("no InferenceGatewayConfig"), "{err}");
    let err = format!(
        "{:#}",
        render_documents(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nmetadata: {name: x, namespace: y}\nspec: {schedulers: 7}\n",
            &opts,
            None
        )
        .unwrap_err()
    );
    assert!(
        err.contains("spec.schedulers: must be a list, not the integer 7"),
        "{err}"
    );
    // Several documents: other kinds are skipped, every config is rendered.
    let good = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/single-model.yaml"),
    )
    .unwrap();
    let stream =
        format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: inference}}\n---\n{good}");
    let out = render_documents(&stream, &opts, None).unwrap();
    assert!(
        out.contains("# Deployment/llama-llama-8b-epp (from inference/llama)"),
        "{out}"
    );
    assert!(!out.contains("kind: Namespace"));
}
