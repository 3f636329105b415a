#!/usr/bin/env bash
# End-to-end check of the operator on a kind cluster: Envoy Gateway with Envoy AI Gateway's
# InferencePool extension, the InferencePool CRD, infergate installed from its Helm chart as a
# user installs it, two emulated vLLM pods, one InferenceGatewayConfig, a check that the operator
# applied exactly what `infergate render` prints, and a real chat-completion request through
# Envoy → body-based router → endpoint picker → pod.
#
# Needs: docker, kind, kubectl, helm, curl, jq. Takes ~10 minutes (most of it the image build).
# Versions it expects are below; override with the environment. KEEP=1 keeps the cluster.
# Documented in docs/operator.md. Not run in CI (no cluster can start there).
set -euo pipefail
cd "$(dirname "$0")/../.."

KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.33.1}
EG_VERSION=${EG_VERSION:-v1.6.0}             # Envoy Gateway Helm chart (ships Gateway API CRDs)
AIGW_VERSION=${AIGW_VERSION:-v0.4.0}         # Envoy AI Gateway (translates InferencePool backends)
GIE_VERSION=${GIE_VERSION:-v1.0.0}           # Gateway API Inference Extension (InferencePool v1)
SOCAT_IMAGE=${SOCAT_IMAGE:-alpine/socat:1.8.0.1}
CLUSTER=${CLUSTER:-infergate-e2e}
IMAGE=infergate:e2e
NS=inference
MODEL=meta-llama/Llama-3.1-8B-Instruct

step() { printf '\n== %s ==\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in docker kind kubectl helm curl jq; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done

cleanup() {
  [ -n "${PF_PID:-}" ] && kill "$PF_PID" 2>/dev/null || true
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

step "cluster"
kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --wait 120s
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "Envoy Gateway $EG_VERSION with Envoy AI Gateway $AIGW_VERSION, InferencePool CRD $GIE_VERSION"
# Envoy Gateway accepts an InferencePool backend only when an extension handles it
# (docs/operator.md): Envoy AI Gateway's extension server, registered as a backend resource.
helm install eg oci://docker.io/envoyproxy/gateway-helm --version "$EG_VERSION" \
  -n envoy-gateway-system --create-namespace -f - --wait <<'YAML'
config:
  envoyGateway:
    extensionManager:
      hooks:
        xdsTranslator:
          translation: {listener: {includeAll: true}, route: {includeAll: true}, cluster: {includeAll: true}, secret: {includeAll: true}}
          post: [Translation, Cluster, Route]
      service:
        fqdn: {hostname: ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local, port: 1063}
      backendResources:
        - {group: inference.networking.k8s.io, kind: InferencePool, version: v1}
YAML
kubectl apply -f "https://github.com/kubernetes-sigs/gateway-api-inference-extension/releases/download/$GIE_VERSION/manifests.yaml"
helm install aieg-crd oci://docker.io/envoyproxy/ai-gateway-crds-helm --version "$AIGW_VERSION" \
  -n envoy-ai-gateway-system --create-namespace --wait
helm install aieg oci://docker.io/envoyproxy/ai-gateway-helm --version "$AIGW_VERSION" \
  -n envoy-ai-gateway-system --wait
kubectl apply -f - <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: eg}
spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
YAML

step "infergate from its Helm chart (CRDs and operator), as docs/install.md installs it"
helm install infergate charts/infergate -n infergate-system --create-namespace \
  --set image.repository="${IMAGE%%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=IfNotPresent
kubectl wait --for=condition=Established crd/inferencegatewayconfigs.infergate.dev --timeout=60s
kubectl -n infergate-system rollout status deploy/infergate-operator --timeout=180s

step "emulated vLLM pods"
kubectl create namespace "$NS"
# The emulator listens on 127.0.0.1:7000 inside the pod; a socat sidecar exposes it on :8000.
kubectl apply -n "$NS" -f - <<YAML
apiVersion: v1
kind: ConfigMap
metadata: {name: sim-fleet}
data:
  fleet.yaml: |
    seed: 1
    pods:
      - {name: pod, profile: llama-3.1-8b/h100, engine: vllm, port: 7000, served_model_name: "$MODEL"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm-llama-8b}
spec:
  replicas: 2
  selector: {matchLabels: {app: vllm-llama-8b}}
  template:
    metadata:
      labels: {app: vllm-llama-8b, inference.networking.k8s.io/engine-type: vllm}
    spec:
      containers:
        - name: sim
          image: $IMAGE
          imagePullPolicy: IfNotPresent
          args: [sim, --fleet, /etc/sim/fleet.yaml]
          volumeMounts: [{name: fleet, mountPath: /etc/sim}]
        - name: expose
          image: $SOCAT_IMAGE
          args: ["TCP-LISTEN:8000,fork,reuseaddr", "TCP:127.0.0.1:7000"]
          ports: [{containerPort: 8000}]
      volumes: [{name: fleet, configMap: {name: sim-fleet}}]
YAML
kubectl -n "$NS" rollout status deploy/vllm-llama-8b --timeout=180s

step "InferenceGatewayConfig"
kubectl apply -f deploy/examples/single-model.yaml
kubectl -n "$NS" wait --for=condition=Accepted igwc/llama --timeout=60s
kubectl -n "$NS" wait --for=condition=Ready igwc/llama --timeout=300s \
  || { kubectl -n "$NS" get igwc llama -o yaml; fail "config did not become Ready"; }
kubectl -n "$NS" get igwc,gateway,httproute,inferencepool,envoyextensionpolicy,deploy,svc

step "the operator applied what infergate render prints"
rendered=$(docker run --rm -i "$IMAGE" render -f - --image "$IMAGE" <deploy/examples/single-model.yaml \
  | kubectl create --dry-run=client -o json -f -)
for d in $(kubectl -n "$NS" get deploy -l infergate.dev/config=llama -o name); do
  live=$(kubectl -n "$NS" get "$d" -o json | jq -c '.spec.template.spec.containers[0].args')
  want=$(echo "$rendered" | jq -c --arg n "${d#*/}" \
    '.items[] | select(.kind == "Deployment" and .metadata.name == $n) | .spec.template.spec.containers[0].args')
  [ "$live" = "$want" ] || fail "$d runs $live, infergate render prints $want"
done

step "request end to end"
svc=$(kubectl -n envoy-gateway-system get svc \
  -l "gateway.envoyproxy.io/owning-gateway-name=llama,gateway.envoyproxy.io/owning-gateway-namespace=$NS" \
  -o jsonpath='{.items[0].metadata.name}')
kubectl -n envoy-gateway-system port-forward "svc/$svc" 18080:80 >/dev/null 2>&1 &
PF_PID=$!
for _ in $(seq 30); do curl -s -o /dev/null localhost:18080 && break; sleep 1; done
body=$(curl -sS --fail-with-body localhost:18080/v1/chat/completions -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8}")
echo "$body" | jq -e '.choices[0].message.content | length > 0' >/dev/null || fail "no completion: $body"
code=$(curl -s -o /dev/null -w '%{http_code}' localhost:18080/v1/chat/completions -H 'content-type: application/json' \
  -d '{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}')
[ "$code" = 404 ] || fail "unknown model answered $code, want 404"

step "a prompt over 32 KiB is routed (the BBR's body streams; a buffered one would be 413 at Envoy's listener buffer)"
prompt=$(printf 'hello %.0s' $(seq 8000))
code=$(curl -s -o /dev/null -w '%{http_code}' localhost:18080/v1/chat/completions -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"$prompt\"}],\"max_tokens\":4}")
[ "$code" = 200 ] || fail "a ${#prompt}-character prompt answered $code, want 200"

step "a streamed answer longer than Envoy's default route timeout (15 s) arrives whole"
# 4,000 tokens at the emulated H100's decode step (about 6 ms) take over 20 s. The HTTPRoute's
# timeouts.request (routeTimeout, 300 s unless set) lets it finish; a route without one gets
# Envoy's default of 15 s and the stream is cut.
start=$(date +%s)
stream=$(curl -sS -N --max-time 120 localhost:18080/v1/chat/completions -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":4000,\"stream\":true}")
took=$(( $(date +%s) - start ))
chunks=$(printf '%s\n' "$stream" | grep -c '^data: {' || true)
printf '%s\n' "$stream" | tail -n 3 | grep -q '^data: \[DONE\]' \
  || fail "the stream ended without [DONE] after ${took}s and $chunks chunks"
[ "$took" -ge 16 ] || fail "the stream took ${took}s: too short to test the route timeout"
echo "streamed $chunks chunks in ${took}s"

step "a streamed answer outlives a rollout of the picker"
# The picker carries the answer's body too (Envoy AI Gateway streams both bodies through it); told
# to stop, it lets open streams finish within its pod's terminationGracePeriodSeconds (the route
# timeout plus 30 s). 16,000 tokens take over 80 s: at Kubernetes' default of 30 s the replaced
# picker would be killed mid-answer and the stream cut.
picker_sel="app.kubernetes.io/component=endpoint-picker,infergate.dev/config=llama"
pickers_before=$(kubectl -n "$NS" get pod -l "$picker_sel" -o jsonpath='{.items[*].metadata.name}')
out=$(mktemp)
curl -sS -N --max-time 240 localhost:18080/v1/chat/completions -H 'content-type: application/json' \
  -d "{\"model\":\"$MODEL\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":16000,\"stream\":true}" \
  >"$out" &
curl_pid=$!
sleep 5
kubectl -n "$NS" rollout restart deploy/llama-llama-8b-epp
kubectl -n "$NS" rollout status deploy/llama-llama-8b-epp --timeout=180s
wait "$curl_pid" || fail "the streamed request failed across the picker's rollout"
tail -n 3 "$out" | grep -q '^data: \[DONE\]' \
  || fail "the stream was cut across the picker's rollout after $(grep -c '^data: {' "$out" || true) chunks"
rm -f "$out"
pickers_after=$(kubectl -n "$NS" get pod -l "$picker_sel" --field-selector=status.phase=Running \
  -o jsonpath='{.items[*].metadata.name}')
[ "$pickers_before" != "$pickers_after" ] || fail "the picker pod was not replaced"

step "one leader"
holder=$(kubectl -n infergate-system get lease infergate-operator -o jsonpath='{.spec.holderIdentity}')
kubectl -n infergate-system get pod "$holder" >/dev/null || fail "lease holder $holder is not an operator pod"

step "deletion cleans up"
kubectl -n "$NS" delete igwc llama --wait --timeout=120s
left=$(kubectl -n "$NS" get deploy,svc,configmap,inferencepool,httproute -l infergate.dev/config=llama -o name | wc -l)
[ "$left" = 0 ] || fail "$left children left after deletion"

echo "PASS"
