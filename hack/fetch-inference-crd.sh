#!/usr/bin/env bash
# Fetches the Gateway API inference extension's InferencePool CRD (inference.networking.k8s.io/v1)
# from its Go module, sigs.k8s.io/gateway-api-inference-extension (config/crd/bases), through the
# Go module proxy, and caches it by version beside the cluster binaries. The test cluster
# installs it; nothing is vendored. A second run only checks the cached file.
# Prints the cached CRD file on its last line.
set -euo pipefail

GIE_VERSION="${KVSCALE_GIE_VERSION:-v1.3.0}"
MODULE=sigs.k8s.io/gateway-api-inference-extension
CRD_FILE=inference.networking.k8s.io_inferencepools.yaml

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvscale"
out_dir="$cache_root/crds/gateway-api-inference-extension-$GIE_VERSION"
out="$out_dir/$CRD_FILE"
log() { printf '[inference-crd] %s\n' "$*" >&2; }

if [ ! -s "$out" ]; then
  mkdir -p "$out_dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log "downloading $MODULE@$GIE_VERSION from the Go module proxy"
  # A throwaway module so `go mod download` has somewhere to run; the module lands in GOMODCACHE.
  (cd "$work" && go mod init kvscale.local/inferencecrd >/dev/null 2>&1)
  dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$GIE_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  src="$dir/config/crd/bases/$CRD_FILE"
  [ -f "$src" ] || { log "$src not found in the module"; exit 1; }
  # The release stamps its bundle version on the CRD: check it is the one asked for.
  grep -q "inference.networking.k8s.io/bundle-version: $GIE_VERSION\$" "$src" \
    || { log "$src does not carry bundle-version $GIE_VERSION"; exit 1; }
  cp "$src" "$out.tmp"
  mv "$out.tmp" "$out"
fi
log "ready: $out"
echo "$out"
