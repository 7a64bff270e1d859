#!/usr/bin/env bash
# Brings up a real single-node Kubernetes on this machine (tests/real_node_support.py):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc, a
# kubelet, a CNI bridge pod network, kube-proxy and CoreDNS in a pod, running the images
# scripts/build-images.sh makes. Idempotent: a node already up is left as it is.
# Everything volatile lives under $STRAITMQ_NODE_RUN (default /run/straitmq-node);
# binaries, images and containerd's content store are cached under .cache/.
# Prints the KUBECONFIG to use; scripts/node-down.sh tears it all down.
# Needs root and cgroups; refuses clearly otherwise.
# `--build-only` installs the packages and builds the binaries and images, then stops: the
# test command runs it before pytest, so that cold builds neither race the tests for the
# CPU nor count against a test's timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_ONLY=0
[[ "${1:-}" == "--build-only" ]] && BUILD_ONLY=1
RUN_DIR="${STRAITMQ_NODE_RUN:-/run/straitmq-node}"
PID_FILE="$RUN_DIR.pid"
py=.venv/bin/python
[[ -x "$py" ]] || py=python3
die() { echo "node-up: $*" >&2; exit 1; }
t0=$SECONDS
step_t0=$SECONDS
step() { step_t0=$SECONDS; echo "node-up: $*" >&2; }
done_step() { echo "node-up:   $((SECONDS - step_t0))s" >&2; }

[[ "$(id -u)" == 0 ]] || die "refusing: needs root (kubelet, containerd, network interfaces, iptables)"
[[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] \
  || die "refusing: no cgroups at /sys/fs/cgroup (neither a v1 memory controller nor cgroup2)"
[[ -d /proc/sys/net/ipv4 ]] || die "refusing: no network stack in /proc/sys/net"

if (( ! BUILD_ONLY )) && [[ -f "$PID_FILE" ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null \
    && [[ -f "$RUN_DIR/ready.json" ]]; then
  echo "node-up: already up (pid $(cat "$PID_FILE"))" >&2
  echo "export KUBECONFIG=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["kubeconfig"])' "$RUN_DIR/ready.json")"
  exit 0
fi

# --- packages -------------------------------------------------------------------------
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v buildah >/dev/null || need+=(buildah)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v ip >/dev/null || need+=(iproute2)
if (( ${#need[@]} )); then
  step "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }
  done_step
fi
# Debian's package may have started its own containerd (only where an init system runs
# services); ours runs with its own config, socket and state, so the two never meet.

# --- disk: a first run's images, buildah's store and containerd's take about 7 GiB --------
# Refuse up front: running out halfway fails the import and every test after it.
need_gib="${STRAITMQ_NODE_DISK_GIB:-8}"
mkdir -p .cache
free_kib=$(df -Pk .cache | awk 'NR==2 {print $4}')
cached_kib=$({ du -sk .cache/images .cache/node 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
if (( free_kib + cached_kib < need_gib * 1024 * 1024 )); then
  die "refusing: $((free_kib / 1024)) MiB free on $(df -P .cache | awk 'NR==2 {print $6}') and $((cached_kib / 1024)) MiB already cached; the node's images and containerd's store need about $need_gib GiB (STRAITMQ_NODE_DISK_GIB)"
fi

# --- binaries and images ---------------------------------------------------------------
step "binaries (scripts/fetch-k8s.sh --node: kubelet, kube-proxy, CoreDNS; cached)"
nice -n 10 ./scripts/fetch-k8s.sh --node
done_step
step "images (scripts/build-images.sh; cached)"
./scripts/build-images.sh
done_step
if (( BUILD_ONLY )); then
  echo "node-up: built in $((SECONDS - t0))s (--build-only: no node started)" >&2
  exit 0
fi

# --- a stale node (crashed runner) is cleaned first -------------------------------------
if [[ -e "$RUN_DIR" || -f "$PID_FILE" ]] || ip link show straitcni0 >/dev/null 2>&1; then
  step "cleaning what a previous node left behind"
  "$py" tests/real_node_support.py down --run-dir "$RUN_DIR" >&2 || true
  done_step
fi

# --- the node ----------------------------------------------------------------------------
step "control plane + containerd + kubelet + kube-proxy + CoreDNS"
rm -f "$RUN_DIR.failed"
mkdir -p "$RUN_DIR"
setsid "$py" tests/real_node_support.py serve --run-dir "$RUN_DIR" \
  </dev/null >"$RUN_DIR.log" 2>&1 &
echo $! >"$PID_FILE"
pid=$!
for _ in $(seq 600); do
  [[ -f "$RUN_DIR/ready.json" ]] && break
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "node-up: the node failed to start; last lines of $RUN_DIR.log:" >&2
    tail -40 "$RUN_DIR.log" >&2
    exit 1
  fi
  sleep 0.5
done
[[ -f "$RUN_DIR/ready.json" ]] || { tail -40 "$RUN_DIR.log" >&2; die "not ready after 300s"; }
grep '^real-node:' "$RUN_DIR.log" | sed 's/^real-node:/node-up:   /' >&2
done_step
echo "node-up: node Ready in $((SECONDS - t0))s in all (logs: $RUN_DIR/work/logs)" >&2
echo "export KUBECONFIG=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["kubeconfig"])' "$RUN_DIR/ready.json")"
