#!/usr/bin/env bash
# Checks the Helm chart (charts/infergate) without a cluster:
#   1. `helm lint --strict` with the default values and every charts/infergate/ci/*-values.yaml;
#   2. every render validates (tests/helm/validate.py: built-in kinds against the Kubernetes
#      schemas in strict mode, InferenceGatewayConfig against our CRD's schema);
#   3. every example of deploy/examples/ passed through `gatewayConfigs` renders to the same spec;
#   4. the chart's CRDs are the ones in crds/, and deploy/operator/operator.yaml is the chart's
#      default render (deploy/operator/render.sh);
#   5. bad values fail, each with the message that names the problem;
#   6. the validator itself rejects a broken object (so step 2 can fail);
#   7. the templates avoid what an EKS add-on cannot render: hooks, `lookup`, `.Capabilities`,
#      `.Release.Service`.
#   8. the built-in objects the operator renders (its golden files) pass the same strict check.
# Needs python3 with pyyaml, jsonschema and kubernetes-validate (.ci/run installs them) and npm
# or HELM (tests/helm/install-helm.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
helm=$(tests/helm/install-helm.sh)
chart=charts/infergate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

"$helm" lint --strict "$chart" >/dev/null || fail "helm lint --strict (defaults)"
ok "helm lint --strict (defaults)"
for values in "$chart"/ci/*-values.yaml; do
  "$helm" lint --strict "$chart" -f "$values" >/dev/null || fail "helm lint --strict -f $values"
  "$helm" template t "$chart" -n infergate-system -f "$values" >"$work/render.yaml"
  python3 tests/helm/validate.py "$work/render.yaml" >/dev/null || {
    python3 tests/helm/validate.py "$work/render.yaml" >&2 || true
    fail "render with $values does not validate"
  }
  ok "lint + validate with $values"
done
"$helm" template infergate "$chart" -n infergate-system >"$work/default.yaml"
python3 tests/helm/validate.py "$work/default.yaml" || fail "default render does not validate"

# 3. The examples through gatewayConfigs: valid, and the spec comes out as it went in.
python3 - "$work/examples-values.yaml" <<'PY'
import pathlib, sys, yaml
configs = []
for path in sorted(pathlib.Path("deploy/examples").glob("*.yaml")):
    for obj in yaml.safe_load_all(path.read_text()):
        if obj and obj.get("kind") == "InferenceGatewayConfig":
            m = obj["metadata"]
            configs.append({"name": m["name"], "namespace": m.get("namespace", "default"), "spec": obj["spec"]})
assert configs, "no examples found"
pathlib.Path(sys.argv[1]).write_text(yaml.safe_dump({"gatewayConfigs": configs}))
PY
"$helm" lint --strict "$chart" -f "$work/examples-values.yaml" >/dev/null || fail "lint with the examples"
"$helm" template infergate "$chart" -n infergate-system -f "$work/examples-values.yaml" >"$work/examples.yaml"
python3 tests/helm/validate.py "$work/examples.yaml" || fail "examples through gatewayConfigs do not validate"
python3 - "$work/examples.yaml" <<'PY'
import pathlib, sys, yaml
rendered = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]
            for o in yaml.safe_load_all(pathlib.Path(sys.argv[1]).read_text())
            if o and o.get("kind") == "InferenceGatewayConfig"}
n = 0
for path in sorted(pathlib.Path("deploy/examples").glob("*.yaml")):
    for obj in yaml.safe_load_all(path.read_text()):
        if obj and obj.get("kind") == "InferenceGatewayConfig":
            key = (obj["metadata"].get("namespace", "default"), obj["metadata"]["name"])
            assert rendered.get(key) == obj["spec"], f"{path}: spec changed through the chart"
            n += 1
print(f"ok: {n} example specs render unchanged through gatewayConfigs")
PY

# 4. Generated copies.
for crd in crds/*.yaml; do
  cmp -s "$crd" "$chart/crds/$(basename "$crd")" || fail "$chart/crds/$(basename "$crd") differs from $crd (run: infergate crdgen --out $chart/crds)"
done
[ "$(ls "$chart"/crds | wc -l)" = "$(ls crds | wc -l)" ] || fail "$chart/crds/ and crds/ hold different files"
ok "chart CRDs = crds/"
sed -n '/^# Source:/,$p' deploy/operator/operator.yaml | sed '1s/^/---\n/' >"$work/committed.yaml"
cmp -s <(sed '/^---$/d' "$work/committed.yaml") <(sed '/^---$/d' "$work/default.yaml") \
  || fail "deploy/operator/operator.yaml is not the chart's default render (run deploy/operator/render.sh)"
ok "deploy/operator/operator.yaml = chart default render"

# 5. Bad values: each must fail, naming the problem.
expect_fail() {
  local want=$1; shift
  if out=$("$helm" template t "$chart" "$@" 2>&1); then
    fail "helm template $* succeeded; expected an error with: $want"
  fi
  grep -qF -- "$want" <<<"$out" || fail "helm template $*: error does not say '$want':
$out"
  ok "rejected ($want): $*"
}
expect_fail "replicaCount" --set replicaCount=0
expect_fail "additional properties 'replicas' not allowed" --set replicas=3
expect_fail "pullPolicy" --set image.pullPolicy=Sometimes
expect_fail "replicaCount > 1 needs leaderElection.enabled" --set leaderElection.enabled=false
expect_fail "leaseSeconds" --set leaderElection.leaseSeconds=1
expect_fail "metrics.serviceMonitor.enabled needs metrics.service.enabled" \
  --set metrics.serviceMonitor.enabled=true --set metrics.service.enabled=false
expect_fail "serviceAccount.name is required" --set serviceAccount.create=false
expect_fail "name" --set 'gatewayConfigs[0].name=Not_A_Name' --set 'gatewayConfigs[0].spec.x=1'
expect_fail "missing property 'spec'" --set 'gatewayConfigs[0].name=ok'

# 6. The validator must be able to fail.
sed 's/^  replicas: 2$/  replicas: 2\n  replicaz: 2/' "$work/default.yaml" >"$work/broken.yaml"
grep -q replicaz "$work/broken.yaml" || fail "could not build the broken render"
if python3 tests/helm/validate.py "$work/broken.yaml" >"$work/broken.out"; then
  fail "validate.py accepted a Deployment with an unknown field"
fi
grep -q "replicaz" "$work/broken.out" || fail "validate.py's error does not name the unknown field: $(cat "$work/broken.out")"
printf 'gatewayConfigs:\n  - name: bad\n    spec: {schedulers: "not a list"}\n' >"$work/bad-spec.yaml"
"$helm" template t "$chart" -f "$work/bad-spec.yaml" >"$work/bad-spec-render.yaml"
if python3 tests/helm/validate.py "$work/bad-spec-render.yaml" >"$work/bad-spec.out"; then
  fail "validate.py accepted an InferenceGatewayConfig whose schedulers is a string"
fi
ok "validator rejects an unknown field and a mistyped spec"
# 7. EKS add-on packaging: the add-on renders the chart without a cluster connection or Helm's
# release bookkeeping, so none of these may appear in a template.
if grep -rnE 'helm\.sh/hook|\blookup\b|\.Capabilities|\.Release\.Service' "$chart/templates"; then
  fail "a template uses a hook, lookup, .Capabilities or .Release.Service (not renderable as an EKS add-on)"
fi
ok "no hooks, lookup, .Capabilities or .Release.Service in the templates"
# 8. What the operator renders at run time: its golden files, built-in kinds in strict mode (the
# Gateway API / InferencePool / Envoy Gateway kinds are validated against their upstream CRDs by
# `cargo test -p infergate-operator`).
for golden in crates/operator/tests/golden/*.yaml; do
  python3 tests/helm/validate.py --skip-kind Gateway --skip-kind HTTPRoute --skip-kind InferencePool \
    --skip-kind EnvoyExtensionPolicy --skip-kind SecurityPolicy "$golden" >/dev/null \
    || { python3 tests/helm/validate.py --skip-kind Gateway --skip-kind HTTPRoute --skip-kind InferencePool \
      --skip-kind EnvoyExtensionPolicy --skip-kind SecurityPolicy "$golden" >&2 || true
      fail "operator golden $golden has an invalid built-in object"; }
done
ok "operator goldens: built-in objects valid (strict)"
echo "helm chart checks passed"
