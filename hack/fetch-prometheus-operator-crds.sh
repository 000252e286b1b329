#!/usr/bin/env bash
# Fetches the Prometheus Operator's CRDs for the kinds the chart creates (PodMonitor,
# ServiceMonitor, PrometheusRule; monitoring.coreos.com/v1) from its Go module,
# github.com/prometheus-operator/prometheus-operator (example/prometheus-operator-crd), through
# the Go module proxy, and caches them by version. Tests install them to check the chart on a
# cluster that has the Prometheus Operator's API; nothing is vendored.
# Prints the cached directory on its last line.
set -euo pipefail

PO_VERSION="${KVSCALE_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
MODULE=github.com/prometheus-operator/prometheus-operator
FILES=(monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_servicemonitors.yaml
       monitoring.coreos.com_prometheusrules.yaml)

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvscale"
out_dir="$cache_root/crds/prometheus-operator-$PO_VERSION"
log() { printf '[prometheus-operator-crds] %s\n' "$*" >&2; }

have=1
for f in "${FILES[@]}"; do [ -s "$out_dir/$f" ] || have=0; done
if [ "$have" = 0 ]; then
  mkdir -p "$out_dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log "downloading $MODULE@$PO_VERSION from the Go module proxy"
  (cd "$work" && go mod init kvscale.local/promoperatorcrds >/dev/null 2>&1)
  dir=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$MODULE@$PO_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  for f in "${FILES[@]}"; do
    src="$dir/example/prometheus-operator-crd/$f"
    [ -f "$src" ] || { log "$src not found in the module"; exit 1; }
    # The release stamps its version on each CRD: check it is the one asked for.
    grep -q "operator.prometheus.io/version: ${PO_VERSION#v}\$" "$src" \
      || { log "$src does not carry operator.prometheus.io/version ${PO_VERSION#v}"; exit 1; }
    cp "$src" "$out_dir/$f.tmp"
    mv "$out_dir/$f.tmp" "$out_dir/$f"
  done
fi
log "ready: $out_dir"
echo "$out_dir"
