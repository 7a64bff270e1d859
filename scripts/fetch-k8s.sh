#!/usr/bin/env bash
# Builds the Kubernetes control plane the operator tests run against, once, into
# .cache/k8s/bin (git-ignored): kube-apiserver, kube-controller-manager and kube-scheduler
# (kwok fakes the nodes and kubelets, not the scheduler) from the Go
# module proxy (k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the
# staging modules with local paths, so a wrapper module pins them to their published
# v0.N.M twins), kwok and helm with `go install`, and etcd from Debian's package.
#
# `--node` also builds what a real node runs (scripts/node-up.sh): kubelet and kube-proxy
# from the same wrapper module (seconds to minutes once the API server is built), and
# CoreDNS and rancher/local-path-provisioner (dynamic hostPath PersistentVolumes) with
# `go install` (their go.mod files have no local replaces).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.17.4}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
NODE=0
[[ "${1:-}" == "--node" ]] && NODE=1
ROOT="$PWD/.cache/k8s"
BIN="$ROOT/bin"
STAMP="$BIN/.versions"
WANT="k8s=$K8S_VERSION kwok=$KWOK_VERSION helm=$HELM_VERSION+k8s etcd=debian"
mkdir -p "$BIN"
# .cache/k8s is shared by every clone (scripts/bootstrap.sh): one build at a time.
exec 8>"$ROOT/.lock"
flock -w 3600 8 || { echo "fetch-k8s: timed out waiting for another build" >&2; exit 1; }

NODE_STAMP="$BIN/.node-versions"
NODE_WANT="kubelet=$K8S_VERSION kube-proxy=$K8S_VERSION coredns=$COREDNS_VERSION"
NODE_WANT+=" local-path-provisioner=$LOCAL_PATH_VERSION"
node_ready() {
  [[ -f "$NODE_STAMP" && "$(cat "$NODE_STAMP")" == "$NODE_WANT" ]] || return 1
  for b in kubelet kube-proxy coredns local-path-provisioner; do [[ -x "$BIN/$b" ]] || return 1; done
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  for b in kube-apiserver kube-controller-manager kube-scheduler kwok helm etcd; do
    [[ -x "$BIN/$b" ]] || { rm -f "$STAMP"; break; }
  done
  if [[ -f "$STAMP" ]] && { (( NODE == 0 )) || node_ready; }; then exit 0; fi
fi

log() { echo "fetch-k8s: $*" >&2; }

# --- etcd from Debian -------------------------------------------------------------
if [[ ! -x "$BIN/etcd" ]]; then
  log "etcd from Debian's etcd-server package"
  tmp="$(mktemp -d)"
  ( cd "$tmp" && { apt-get download etcd-server >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get download etcd-server >/dev/null; }; } )
  dpkg-deb -x "$tmp"/etcd-server_*.deb "$tmp/x"
  install -m 0755 "$tmp/x/usr/bin/etcd" "$BIN/etcd"
  rm -rf "$tmp"
fi

# --- kube-apiserver + kube-controller-manager ---------------------------------------
minor="${K8S_VERSION#v1.}"            # 32.13
staging="v0.${minor}"                 # v0.32.13
mod="$ROOT/build-$K8S_VERSION"
ldflags="-s -w"
for v in "k8s.io/component-base/version" "k8s.io/client-go/pkg/version"; do
  ldflags+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=${minor%%.*}"
  ldflags+=" -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
done
if [[ ! -x "$BIN/kube-apiserver" || ! -x "$BIN/kube-controller-manager" || ! -x "$BIN/kube-scheduler" \
      || ! -f "$mod/.built" ]]; then
  log "kube-apiserver, kube-controller-manager and kube-scheduler $K8S_VERSION (minutes on 2 cores)"
  mkdir -p "$mod"
  # The module's own go.mod, through the go command (whatever GOPROXY it is set up with).
  gomod_file="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -nE 's/^[[:space:]]*"GoMod": "(.*)",?$/\1/p')"
  [[ -f "$gomod_file" ]] || { log "go mod download k8s.io/kubernetes@$K8S_VERSION gave no go.mod"; exit 1; }
  gomod="$(cat "$gomod_file")"
  {
    echo "module straitmq.local/k8sbuild"
    echo
    echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # Every `k8s.io/x => ./staging/src/k8s.io/x` line becomes `k8s.io/x => k8s.io/x v0.N.M`.
    sed -nE 's#^[[:space:]]*(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+#\1#p' <<<"$gomod" \
      | sort -u | while read -r m; do echo "	$m => $m $staging"; done
    echo ")"
  } >"$mod/go.mod"
  cat >"$mod/tools.go" <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  ( cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
    cd "$mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
      -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler )
  touch "$mod/.built"
fi

# --- kwok and helm -----------------------------------------------------------------
if [[ ! -x "$BIN/kwok" ]]; then
  log "kwok $KWOK_VERSION"
  GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if [[ ! -x "$BIN/helm" ]]; then
  log "helm $HELM_VERSION"
  GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor%%.*} \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor%%.*}" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

echo "$WANT" >"$STAMP"

# --- a real node's binaries (--node) -------------------------------------------------
if (( NODE == 1 )) && ! node_ready; then
  if [[ ! -x "$BIN/kubelet" || ! -x "$BIN/kube-proxy" ]]; then
    log "kubelet and kube-proxy $K8S_VERSION"
    ( cd "$mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
        -o "$BIN/" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy )
  fi
  if [[ ! -x "$BIN/coredns" ]]; then
    log "coredns $COREDNS_VERSION (a few minutes on 2 cores)"
    GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "github.com/coredns/coredns@$COREDNS_VERSION"
  fi
  if [[ ! -x "$BIN/local-path-provisioner" ]]; then
    log "local-path-provisioner $LOCAL_PATH_VERSION (about 2 minutes on 2 cores)"
    GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
      "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION"
  fi
  echo "$NODE_WANT" >"$NODE_STAMP"
fi
