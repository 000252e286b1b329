#!/usr/bin/env bash
# Fetches the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io/v1) from its Go module, sigs.k8s.io/lws
# (config/crd/bases), through the Go module proxy, and caches it by version beside the cluster
# binaries. The test cluster installs it (kvscale deploys plans larger than a node as a
# LeaderWorkerSet); nothing is vendored. A second run only checks the cached file.
# Prints the cached CRD file on its last line.
set -euo pipefail

LWS_VERSION="${KVSCALE_LWS_VERSION:-v0.7.0}"
MODULE=sigs.k8s.io/lws
CRD_FILE=leaderworkerset.x-k8s.io_leaderworkersets.yaml

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvscale"
out_dir="$cache_root/crds/lws-$LWS_VERSION"
out="$out_dir/$CRD_FILE"
log() { printf '[lws-crd] %s\n' "$*" >&2; }

if [ ! -s "$out" ]; then
  mkdir -p "$out_dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log "downloading $MODULE@$LWS_VERSION from the Go module proxy"
  # A throwaway module so `go mod download` has somewhere to run; the module lands in GOMODCACHE.
  (cd "$work" && go mod init kvscale.local/lwscrd >/dev/null 2>&1)
  dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$LWS_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  src="$dir/config/crd/bases/$CRD_FILE"
  [ -f "$src" ] || { log "$src not found in the module"; exit 1; }
  # The CRD carries no release stamp: check it is the LeaderWorkerSet v1 CRD with the scale
  # subresource kvscale scales groups through.
  grep -q '^  name: leaderworkersets.leaderworkerset.x-k8s.io$' "$src" \
    || { log "$src is not the leaderworkersets.leaderworkerset.x-k8s.io CRD"; exit 1; }
  grep -q 'specReplicasPath: .spec.replicas' "$src" \
    || { log "$src has no scale subresource on .spec.replicas"; exit 1; }
  cp "$src" "$out.tmp"
  mv "$out.tmp" "$out"
fi
log "ready: $out"
echo "$out"
