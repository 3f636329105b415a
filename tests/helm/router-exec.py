#!/usr/bin/env python3
"""Prepares the global router's rendered Deployment to run on this machine.

Usage: router-exec.py RENDER.yaml OUT_DIR

Reads the chart's render, finds the global router's Deployment and ConfigMap, and checks their
wiring: the container's `--config` path lies in the ConfigMap's mount and names one of its keys.
Writes that key's content to OUT_DIR/<key>, and prints (NUL-separated) the container's
environment as NAME=VALUE (a placeholder for values taken from Secrets or fields) followed by
`--` and its arguments with the config path rewritten to the local copy, for the caller to exec.
"""
import pathlib
import sys

import yaml


def main() -> int:
    render, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    objs = [o for o in yaml.safe_load_all(render.read_text()) if o]
    deps = [o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == "global-router"]
    if len(deps) != 1:
        print(f"expected one global-router Deployment, found {len(deps)}", file=sys.stderr)
        return 1
    pod = deps[0]["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "global-router"]
    args = c["args"]
    config = [a for a in args if a.startswith("--config=")]
    if len(config) != 1:
        print(f"expected one --config=... argument, got {args}", file=sys.stderr)
        return 1
    path = pathlib.PurePosixPath(config[0].split("=", 1)[1])
    mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
    found = None
    for v in pod.get("volumes", []):
        cm = v.get("configMap")
        m = mounts.get(v["name"])
        if cm and m and path.parent == pathlib.PurePosixPath(m["mountPath"]):
            found = cm["name"]
    if found is None:
        print(f"{path} is not in a mounted ConfigMap", file=sys.stderr)
        return 1
    cms = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == found]
    if len(cms) != 1 or path.name not in cms[0].get("data", {}):
        print(f"ConfigMap {found} has no key {path.name}", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    local = out / path.name
    local.write_text(cms[0]["data"][path.name])
    words = []
    for e in c.get("env", []):
        words.append(f"{e['name']}={e.get('value', 'placeholder-from-' + e['name'])}")
    words.append("--")
    words.extend(f"--config={local}" if a in config else a for a in args)
    sys.stdout.write("\0".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
