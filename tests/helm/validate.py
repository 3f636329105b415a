#!/usr/bin/env python3
"""Validates every object of a rendered manifest stream (standard input or a file).

Built-in kinds are checked with kubernetes-validate in strict mode (unknown fields are errors)
against the Kubernetes version given with --k8s; InferenceGatewayConfig objects against the
openAPIV3Schema of our CRD in crds/; ServiceMonitor objects against the fields the chart writes.
Any other kind is an error, so nothing rendered goes unchecked. Exits 1 with one line per problem.
"""
import argparse
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def crd_schema(kind):
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
            return crd["spec"]["group"] + "/" + version["name"], to_json_schema(
                version["schema"]["openAPIV3Schema"]
            )
    raise SystemExit(f"no CRD for kind {kind} in crds/")


def to_json_schema(node):
    """OpenAPI v3 structural schema -> JSON Schema: `nullable` becomes a null type,
    int-or-string becomes either type, x-kubernetes-* extensions (CEL rules, checked by the
    Rust validator and the API server) are dropped."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def check_tls_config(tls, where):
    """The fields of monitoring.coreos.com/v1 TLSConfig the chart writes: a CA from a Secret's
    key, the name to verify, or no verification."""
    if tls is None:
        return []
    problems = []
    unknown = set(tls) - {"ca", "serverName", "insecureSkipVerify"}
    if unknown:
        problems.append(f"{where} has unknown fields {sorted(unknown)}")
    if "insecureSkipVerify" in tls and not isinstance(tls["insecureSkipVerify"], bool):
        problems.append(f"{where}.insecureSkipVerify is not a boolean")
    if "serverName" in tls and not (isinstance(tls["serverName"], str) and tls["serverName"]):
        problems.append(f"{where}.serverName is not a name")
    if "ca" in tls:
        secret = (tls["ca"] or {}).get("secret") or {}
        if set(tls["ca"]) != {"secret"} or set(secret) != {"name", "key"} \
                or not all(isinstance(secret[k], str) and secret[k] for k in ("name", "key")):
            problems.append(f"{where}.ca is not {{secret: {{name, key}}}}: {tls['ca']}")
    return problems


def check_service_monitor(obj):
    spec = obj.get("spec") or {}
    problems = []
    if not spec.get("selector", {}).get("matchLabels"):
        problems.append("spec.selector.matchLabels is empty")
    for i, ep in enumerate(spec.get("endpoints") or []):
        # bearerTokenFile: the scraping Prometheus's own token, for the operator's /metrics
        # (metrics.auth: kubernetes); a field of monitoring.coreos.com/v1 Endpoint.
        # tlsConfig: how it verifies the operator's HTTPS metrics port (metrics.tls).
        unknown = set(ep) - {"port", "path", "interval", "scheme", "scrapeTimeout", "bearerTokenFile",
                             "tlsConfig"}
        if unknown:
            problems.append(f"spec.endpoints[{i}] has unknown fields {sorted(unknown)}")
        if ep.get("scheme", "http") not in ("http", "https"):
            problems.append(f"spec.endpoints[{i}].scheme is {ep['scheme']!r}, not http or https")
        problems += check_tls_config(ep.get("tlsConfig"), f"spec.endpoints[{i}].tlsConfig")
        if not ep.get("port"):
            problems.append(f"spec.endpoints[{i}].port is missing")
    if not spec.get("endpoints"):
        problems.append("spec.endpoints is empty")
    return problems


def check_prometheus_rule(obj):
    """The fields of monitoring.coreos.com/v1 PrometheusRule the chart writes: groups of alerting
    rules (the PromQL itself is checked by promtool, tests/alerts/)."""
    spec = obj.get("spec") or {}
    problems = []
    if set(spec) != {"groups"}:
        problems.append(f"spec has fields {sorted(spec)}, not only groups")
    groups = spec.get("groups") or []
    if not groups:
        problems.append("spec.groups is empty")
    for i, g in enumerate(groups):
        where = f"spec.groups[{i}]"
        unknown = set(g) - {"name", "interval", "rules", "limit", "partial_response_strategy"}
        if unknown:
            problems.append(f"{where} has unknown fields {sorted(unknown)}")
        if not (isinstance(g.get("name"), str) and g["name"]):
            problems.append(f"{where}.name is missing")
        if not g.get("rules"):
            problems.append(f"{where}.rules is empty")
        for j, r in enumerate(g.get("rules") or []):
            at = f"{where}.rules[{j}]"
            unknown = set(r) - {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if unknown:
                problems.append(f"{at} has unknown fields {sorted(unknown)}")
            if not (isinstance(r.get("expr"), str) and r["expr"].strip()):
                problems.append(f"{at}.expr is missing")
            if ("alert" in r) == ("record" in r):
                problems.append(f"{at} has neither or both of alert and record")
            for k in ("labels", "annotations"):
                if not all(isinstance(v, str) for v in (r.get(k) or {}).values()):
                    problems.append(f"{at}.{k} has a value that is not a string")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s", default="1.33.0", help="Kubernetes version of the built-in schemas")
    ap.add_argument(
        "--skip-kind",
        action="append",
        default=[],
        help="a kind checked elsewhere (e.g. against upstream CRDs by the operator's tests)",
    )
    ap.add_argument("file", nargs="?", default="-")
    args = ap.parse_args()
    text = sys.stdin.read() if args.file == "-" else pathlib.Path(args.file).read_text()
    igc_api, igc_schema = crd_schema("InferenceGatewayConfig")
    problems, count = [], 0
    for obj in yaml.safe_load_all(text):
        if not obj:
            continue
        count += 1
        kind = obj.get("kind")
        where = f"{kind}/{obj.get('metadata', {}).get('name')}"
        if kind in args.skip_kind:
            continue
        if kind == "InferenceGatewayConfig":
            if obj.get("apiVersion") != igc_api:
                problems.append(f"{where}: apiVersion {obj.get('apiVersion')} is not {igc_api}")
            for err in jsonschema.Draft7Validator(igc_schema).iter_errors(obj):
                path = ".".join(str(p) for p in err.absolute_path)
                problems.append(f"{where}: {path}: {err.message}")
        elif kind == "ServiceMonitor":
            problems += [f"{where}: {p}" for p in check_service_monitor(obj)]
        elif kind == "PrometheusRule":
            if obj.get("apiVersion") != "monitoring.coreos.com/v1":
                problems.append(f"{where}: apiVersion {obj.get('apiVersion')} is not monitoring.coreos.com/v1")
            problems += [f"{where}: {p}" for p in check_prometheus_rule(obj)]
        else:
            try:
                kubernetes_validate.validate(obj, args.k8s, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{where}: no schema for {obj.get('apiVersion')} {kind}")
            except kubernetes_validate.ValidationError as err:
                path = ".".join(str(p) for p in err.path)
                problems.append(f"{where}: {path}: {err.message}")
    if count == 0:
        problems.append("no objects rendered")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"{count} objects valid (Kubernetes {args.k8s} schemas, strict; CRD schema for custom kinds)")


if __name__ == "__main__":
    main()
