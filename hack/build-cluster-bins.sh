#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy (no Docker, no downloads of
# prebuilt binaries) and caches them by version, so a second run only checks they exist.
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: one wrapper
#     module that requires k8s.io/kubernetes and replaces every staging module with its
#     published v0.Y.Z twin (k8s.io/kubernetes is not meant to be required directly).
#   kwok and helm: `go install pkg@version`, their own go.mod as published.
#   prometheus and promtool: `go install` from the module proxy too (Prometheus 3.x is
#     published as module github.com/prometheus/prometheus v0.3XY.Z = release 3.XY.Z). Built
#     without the `builtinassets` tag, so the web UI is not embedded (it needs npm): the HTTP
#     API, which tests and the operator use, is all there. Service discovery is trimmed to
#     kubernetes_sd and static configs (build tags remove_all_sd,enable_kubernetes_sd).
# Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION="${KVSCALE_K8S_VERSION:-v1.34.4}"
KWOK_VERSION="${KVSCALE_KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${KVSCALE_HELM_VERSION:-v3.21.4}"
PROMETHEUS_VERSION="${KVSCALE_PROMETHEUS_VERSION:-3.16.0}"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/kvscale"
bin_dir="$cache_root/cluster-bins/k8s-$K8S_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
mkdir -p "$bin_dir"
log() { printf '[cluster-bins] %s\n' "$*" >&2; }

staging_minor="${K8S_VERSION#v1.}"   # 34.4 -> v0.34.4
staging_version="v0.$staging_minor"
k8s_major_minor="${K8S_VERSION#v}"; k8s_minor="${k8s_major_minor#1.}"; k8s_minor="${k8s_minor%%.*}"

build_k8s() {
  local have=1
  for name in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd; do
    [ -x "$bin_dir/$name" ] || have=0
  done
  [ "$have" = 1 ] && return 0
  local work="$cache_root/wrapper-$K8S_VERSION"
  mkdir -p "$work"
  local k8s_mod
  k8s_mod=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module kvscale.local/clusterbins"
    echo
    grep -E '^go [0-9]' "$k8s_mod"
    grep -E '^godebug ' "$k8s_mod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # Every staging module k8s.io/kubernetes points at ./staging gets its published twin.
    grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$k8s_mod" \
      | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$work/go.mod"
  cat > "$work/tools.go" <<'GO'
//go:build tools

package tools
GO
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
              k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3)
  # etcd at the version this Kubernetes release pins, not the newest one.
  local etcd_version
  etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$k8s_mod")
  log "resolving modules for kubernetes $K8S_VERSION (etcd $etcd_version)"
  local k8s_pkgs=("${pkgs[@]:0:4}")
  (cd "$work" && go get "${k8s_pkgs[@]/%/@$K8S_VERSION}" "go.etcd.io/etcd/server/v3@$etcd_version")
  local ldflags=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for pkg in "${pkgs[@]}"; do
    local name="${pkg##*/}"
    [ "$name" = v3 ] && name=etcd
    if [ -x "$bin_dir/$name" ]; then continue; fi
    log "building $name"
    (cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$name.tmp" "$pkg")
    mv "$bin_dir/$name.tmp" "$bin_dir/$name"
  done
}

build_installable() {   # name module/path@version
  local name=$1 target=$2
  [ -x "$bin_dir/$name" ] && return 0
  log "building $name ($target)"
  local gobin; gobin=$(mktemp -d)
  CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath "$target"
  mv "$gobin/$name" "$bin_dir/$name"
  rm -rf "$gobin"
}

kwok_stages() {
  # kwok ships its lifecycle stages as YAML inside its module, not in the binary:
  # Nodes become Ready and renew leases, Pods bound to them run, complete and delete.
  [ -f "$bin_dir/kwok-stages.yaml" ] && return 0
  local dir; dir="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  [ -d "$dir" ] || (cd "$(mktemp -d)" && go mod download "sigs.k8s.io/kwok@$KWOK_VERSION")
  local out="$bin_dir/kwok-stages.yaml.tmp"; : > "$out"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    printf -- '---\n' >> "$out"; cat "$dir/$f" >> "$out"
  done
  mv "$out" "$bin_dir/kwok-stages.yaml"
}

build_prometheus() {
  # Cached by version: a stamp beside the binaries names the release they were built from.
  local stamp="$bin_dir/prometheus.version"
  if [ -x "$bin_dir/prometheus" ] && [ -x "$bin_dir/promtool" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$PROMETHEUS_VERSION" ]; then
    return 0
  fi
  local major_minor="${PROMETHEUS_VERSION%.*}" patch="${PROMETHEUS_VERSION##*.}"
  # 3.16.0 -> v0.316.0: the module version is v0.<major><minor, two digits>.<patch>
  local module_version
  module_version="v0.${major_minor%%.*}$(printf '%02d' "${major_minor#*.}").$patch"
  log "building prometheus $PROMETHEUS_VERSION (github.com/prometheus/prometheus@$module_version)"
  local gobin; gobin=$(mktemp -d)
  local v=github.com/prometheus/common/version
  CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=release -X $v.Revision=$module_version -X $v.BuildUser=kvscale -X $v.BuildDate=19700101-00:00:00" \
    "github.com/prometheus/prometheus/cmd/prometheus@$module_version" \
    "github.com/prometheus/prometheus/cmd/promtool@$module_version"
  mv "$gobin/prometheus" "$bin_dir/prometheus"
  mv "$gobin/promtool" "$bin_dir/promtool"
  rm -rf "$gobin"
  echo "$PROMETHEUS_VERSION" > "$stamp"
}

build_k8s
build_installable kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
build_installable helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
kwok_stages
build_prometheus
log "ready: $bin_dir"
echo "$bin_dir"
