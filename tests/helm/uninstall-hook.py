#!/usr/bin/env python3
"""Checks the chart's uninstall hook in a render and prints its command line.

Usage: uninstall-hook.py RENDER.yaml --release NAME --namespace NS --timeout SECONDS
                         [--watch-namespaces A,B]

In RENDER (a `helm template` output with the hook enabled), checks the uninstall hook's objects:
a ServiceAccount, a ClusterRole, a ClusterRoleBinding and a Job (with --watch-namespaces, the
chart's watchNamespaces: a Role and a RoleBinding in each of those namespaces instead of the
ClusterRole and its binding), each a `pre-delete` hook deleted before re-creation and on
success, the RBAC weighted before the Job; each role grants exactly get, list, delete on
inferencegatewayconfigs.infergate.dev and nothing else; each binding ties it to the hook's
ServiceAccount, which the Job runs as; the Job tries once
(`backoffLimit: 0`, `restartPolicy: Never`), has a deadline a little over the command's timeout
and a TTL; it runs the operator Deployment's image, pull policy and pull secrets with the same
hardening (non-root, RuntimeDefault seccomp, read-only root, no privilege escalation, every
capability dropped) and, like the operator's container, gives only `args` to the image's
entrypoint; its pod is not selected by the operator's selector. No other object is a hook.

Then prints (NUL-separated) the container's environment as NAME=VALUE, `--`, and the command
line the container runs: the image's ENTRYPOINT (from the Dockerfile) followed by the rendered
`args`, for the caller to exec with a local binary. Exits 1 naming every problem found.
"""
import argparse
import json
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def entrypoint():
    """The Dockerfile's exec-form ENTRYPOINT: what runs a container that sets no `command`."""
    lines = [l for l in (ROOT / "Dockerfile").read_text().splitlines() if l.startswith("ENTRYPOINT")]
    if len(lines) != 1:
        raise SystemExit(f"Dockerfile: expected one ENTRYPOINT, found {len(lines)}")
    words = json.loads(lines[0].split(None, 1)[1])
    if not isinstance(words, list) or not words:
        raise SystemExit(f"Dockerfile: ENTRYPOINT is not an exec-form list: {lines[0]}")
    return words


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("render")
    ap.add_argument("--release", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--timeout", type=int, required=True)
    ap.add_argument("--watch-namespaces", default="")
    args = ap.parse_args()
    watched = [n for n in args.watch_namespaces.split(",") if n]
    # The RBAC kinds: one cluster-wide role and binding, or a Role and RoleBinding per namespace.
    role_kind = "Role" if watched else "ClusterRole"
    want_kinds = {"ServiceAccount": 1, role_kind: len(watched) or 1, role_kind + "Binding": len(watched) or 1, "Job": 1}
    objs = [o for o in yaml.safe_load_all(pathlib.Path(args.render).read_text()) if o]
    problems = []

    def check(cond, msg):
        if not cond:
            problems.append(msg)
        return cond

    def annotations(o):
        return (o.get("metadata") or {}).get("annotations") or {}

    hooks = [o for o in objs if "helm.sh/hook" in annotations(o)]
    by_kind = {}
    for o in hooks:
        where = f"{o['kind']}/{o['metadata']['name']}"
        check(o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "uninstall-hook",
              f"{where} is a hook but not part of the uninstall hook")
        by_kind.setdefault(o["kind"], []).append(o)
    counts = {k: len(v) for k, v in by_kind.items()}
    if not check(counts == want_kinds, f"hook objects are {counts}, expected {want_kinds}"):
        return report(problems)
    (sa,), roles, bindings, (job,) = (by_kind[k] for k in want_kinds)
    if watched:
        for kind, objs_of_kind in ((role_kind, roles), (role_kind + "Binding", bindings)):
            where = sorted(o["metadata"].get("namespace") for o in objs_of_kind)
            check(where == sorted(watched), f"the hook's {kind}s are in {where}, expected {sorted(watched)}")
    names = {o["metadata"]["name"] for o in hooks}
    check(len(names) == 1, f"the hook's objects have different names: {sorted(names)}")
    name = sa["metadata"]["name"]
    weights = {}
    for o in hooks:
        where = f"{o['kind']}/{o['metadata']['name']}"
        a = annotations(o)
        check(a.get("helm.sh/hook") == "pre-delete", f"{where}: helm.sh/hook is {a.get('helm.sh/hook')!r}, not pre-delete")
        policy = sorted(p.strip() for p in str(a.get("helm.sh/hook-delete-policy", "")).split(","))
        check(policy == ["before-hook-creation", "hook-succeeded"],
              f"{where}: helm.sh/hook-delete-policy is {a.get('helm.sh/hook-delete-policy')!r}")
        try:
            weights[(where, o["metadata"].get("namespace"))] = int(a.get("helm.sh/hook-weight", "0"))
        except ValueError:
            problems.append(f"{where}: helm.sh/hook-weight {a.get('helm.sh/hook-weight')!r} is not an integer")
    job_key = (f"Job/{job['metadata']['name']}", job["metadata"].get("namespace"))
    if len(weights) == len(hooks):
        for k, w in weights.items():
            check(k == job_key or w < weights[job_key],
                  f"{k[0]} has hook weight {w}, not below the Job's {weights[job_key]}: it may not exist when the Job starts")
    for o in (sa, job):
        check(o["metadata"].get("namespace") == args.namespace,
              f"{o['kind']}/{name} is not in the release namespace {args.namespace}")

    # RBAC: exactly get, list, delete on the configs.
    for role in roles:
        rules = role.get("rules") or []
        check(len(rules) == 1, f"{role_kind}/{name} has {len(rules)} rules, expected 1: {rules}")
        for r in rules:
            check(r.get("apiGroups") == ["infergate.dev"], f"{role_kind}/{name}: apiGroups {r.get('apiGroups')}")
            check(r.get("resources") == ["inferencegatewayconfigs"], f"{role_kind}/{name}: resources {r.get('resources')}")
            check(sorted(r.get("verbs") or []) == ["delete", "get", "list"],
                  f"{role_kind}/{name}: verbs {r.get('verbs')}, expected exactly get, list, delete")
            check(not (set(r) - {"apiGroups", "resources", "verbs"}), f"{role_kind}/{name}: extra rule fields {sorted(set(r))}")
    for binding in bindings:
        check(binding.get("roleRef") == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
              f"{role_kind}Binding/{name}: roleRef {binding.get('roleRef')}")
        check(binding.get("subjects") == [{"kind": "ServiceAccount", "name": name, "namespace": args.namespace}],
              f"{role_kind}Binding/{name}: subjects {binding.get('subjects')}")

    # The Job.
    spec = job["spec"]
    pod = spec["template"]["spec"]
    check(spec.get("backoffLimit") == 0, f"Job/{name}: backoffLimit {spec.get('backoffLimit')}, expected 0")
    check(pod.get("restartPolicy") == "Never", f"Job/{name}: restartPolicy {pod.get('restartPolicy')}")
    deadline = spec.get("activeDeadlineSeconds")
    check(isinstance(deadline, int) and args.timeout < deadline <= args.timeout + 120,
          f"Job/{name}: activeDeadlineSeconds {deadline}, expected a little above the timeout {args.timeout}")
    check(isinstance(spec.get("ttlSecondsAfterFinished"), int) and spec["ttlSecondsAfterFinished"] > 0,
          f"Job/{name}: no ttlSecondsAfterFinished")
    check(pod.get("serviceAccountName") == name, f"Job/{name}: serviceAccountName {pod.get('serviceAccountName')}")
    containers = pod.get("containers") or []
    if not check(len(containers) == 1 and not pod.get("initContainers"), f"Job/{name}: expected one container"):
        return report(problems)
    c = containers[0]

    # Same image, pull settings and hardening as the operator.
    deps = [o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"]
    if not check(len(deps) == 1, f"expected one operator Deployment, found {len(deps)}"):
        return report(problems)
    opod = deps[0]["spec"]["template"]["spec"]
    (oc,) = [x for x in opod["containers"] if x["name"] == "operator"]
    for key in ("image", "imagePullPolicy"):
        check(c.get(key) == oc.get(key), f"Job/{name}: {key} {c.get(key)!r}, the operator's is {oc.get(key)!r}")
    check(pod.get("imagePullSecrets") == opod.get("imagePullSecrets"),
          f"Job/{name}: imagePullSecrets {pod.get('imagePullSecrets')}, the operator's are {opod.get('imagePullSecrets')}")
    psc, sc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    check(psc == opod.get("securityContext"), f"Job/{name}: pod securityContext differs from the operator's")
    check(sc == oc.get("securityContext"), f"Job/{name}: container securityContext differs from the operator's")
    check(psc.get("runAsNonRoot") is True, f"Job/{name}: pod securityContext.runAsNonRoot is not true")
    check((psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", f"Job/{name}: seccomp is not RuntimeDefault")
    check(sc.get("readOnlyRootFilesystem") is True, f"Job/{name}: root filesystem is not read-only")
    check(sc.get("allowPrivilegeEscalation") is False, f"Job/{name}: privilege escalation is not disabled")
    check((sc.get("capabilities") or {}).get("drop") == ["ALL"], f"Job/{name}: capabilities are not all dropped")
    check(not (sc.get("capabilities") or {}).get("add"), f"Job/{name}: capabilities added")
    check(not sc.get("privileged"), f"Job/{name}: privileged")
    # The operator's Service and PodDisruptionBudget select by the operator's selector labels.
    selector = deps[0]["spec"]["selector"]["matchLabels"]
    labels = spec["template"]["metadata"].get("labels") or {}
    check(any(labels.get(k) != v for k, v in selector.items()),
          f"Job/{name}: its pod matches the operator's selector {selector}")

    # The command line: the entrypoint convention of the operator's container, and exactly the
    # arguments of `infergate delete-configs`.
    check("command" not in oc and oc.get("args", [None])[0] == "operator",
          "the operator's container no longer runs `args: [operator, ...]` on the image's entrypoint")
    check("command" not in c, f"Job/{name}: sets command {c.get('command')}; the operator's container gives only args")
    want = ["delete-configs", "--selector", f"app.kubernetes.io/instance={args.release}",
            "--timeout-seconds", str(args.timeout)]
    if watched:
        want += ["--namespaces", ",".join(watched)]
    check(c.get("args") == want, f"Job/{name}: args {c.get('args')}, expected {want}")
    if problems:
        return report(problems)
    words = [f"{e['name']}={e.get('value', 'placeholder-from-' + e['name'])}" for e in c.get("env", [])]
    words.append("--")
    words.extend(c.get("command") or entrypoint())
    words.extend(c["args"])
    sys.stdout.write("\0".join(words))
    return 0


def report(problems):
    for p in problems:
        print(p, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
