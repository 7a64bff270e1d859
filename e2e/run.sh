#!/usr/bin/env bash
# End-to-end test of StraitMQ on a real (kind) Kubernetes cluster; see e2e/README.md.
#
#   e2e/run.sh                 # create the cluster, run everything, delete the cluster
#   E2E_KEEP=1 e2e/run.sh      # keep the kind cluster afterwards (to poke at it)
#
# Needs Docker (a running engine), kind, kubectl, helm, curl and python3 on PATH.
# Steps: kind cluster -> docker build -> kind load -> helm install (operator, CRDs and an
# MQCluster "demo") -> wait Ready -> apply examples/open/topic.yaml -> wait Topic Ready ->
# produce -> scale 3 -> 5 (producing while partitions move) -> scale 5 -> 3 -> produce ->
# consume everything and check that no message was lost.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${E2E_CLUSTER:-straitmq-e2e}"          # kind cluster name
IMAGE_REPO="${E2E_IMAGE_REPO:-straitmq}"
IMAGE_TAG="${E2E_IMAGE_TAG:-e2e}"
IMAGE="$IMAGE_REPO:$IMAGE_TAG"
NS="${E2E_NAMESPACE:-straitmq}"
RELEASE=straitmq
MQ=demo                                          # the MQCluster; examples/open/topic.yaml uses it
TOPIC=orders
PARTITIONS=3
PER_PARTITION="${E2E_MESSAGES_PER_PARTITION:-200}"
KEEP="${E2E_KEEP:-0}"
NODE_IMAGE="${E2E_NODE_IMAGE:-}"                 # e.g. kindest/node:v1.33.1; empty: kind's default
CTX="kind-$CLUSTER"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/straitmq-e2e.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT   # replaced by cleanup() once there is a cluster to clean up
PF_PIDS=()
BROKER_PF_PID=""
BROKER_PORT=""

log() { printf '%s e2e: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
kc() { kubectl --context "$CTX" -n "$NS" "$@"; }

# wait_for SECONDS DESCRIPTION COMMAND...: run COMMAND every 3 s until it succeeds.
wait_for() {
  local timeout="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  log "waiting (up to ${timeout}s) for $what"
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for $what"
    sleep 3
  done
}

diagnostics() {
  log "diagnostics (work dir $WORK)"
  kc get mqcluster,topic,statefulset,pod,svc,pdb,pvc -o wide 2>&1 || true
  kc get mqcluster "$MQ" -o yaml 2>&1 | sed -n '/^status:/,$p' || true
  kc get events --sort-by=.lastTimestamp 2>&1 | tail -40 || true
  kc logs "deployment/$RELEASE-operator" --tail=200 2>&1 || true
  for pod in $(kc get pods -o name 2>/dev/null | grep -E "/$MQ-(broker|controller)-" || true); do
    echo "--- $pod"
    kc logs "$pod" --tail=40 2>&1 || true
  done
}

cleanup() {
  local rc=$?
  trap - EXIT
  ((rc == 0)) || diagnostics
  # (the odd expansion keeps `set -u` quiet about an empty array in bash < 4.4)
  for pid in ${PF_PIDS[@]+"${PF_PIDS[@]}"}; do kill "$pid" 2>/dev/null || true; done
  if [[ "$KEEP" == 1 ]]; then
    log "keeping kind cluster $CLUSTER (kubectl --context $CTX); delete: kind delete cluster --name $CLUSTER"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  if ((rc == 0)); then log "PASSED"; else log "exit status $rc"; fi
  exit "$rc"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# kubectl port-forward in the background; sets PF_LAST_PID.
port_forward() {
  local target="$1" ports="$2" name="$3"
  kc port-forward "$target" "$ports" >"$WORK/pf-$name.log" 2>&1 &
  PF_LAST_PID=$!
  PF_PIDS+=("$PF_LAST_PID")
}

# The admin API of broker 0 through a port-forward (broker 0 is never removed by a scale
# down). Restarted when it died, e.g. because the pod restarted.
broker_api() {
  local path="$1"
  if [[ -z "$BROKER_PF_PID" ]] || ! kill -0 "$BROKER_PF_PID" 2>/dev/null; then
    BROKER_PORT="$(free_port)"
    port_forward "pod/$MQ-broker-0" "$BROKER_PORT:$HTTP_PORT" broker
    BROKER_PF_PID="$PF_LAST_PID"
    local _
    for _ in $(seq 1 20); do
      curl -fsS --max-time 2 "http://127.0.0.1:$BROKER_PORT/healthz" >/dev/null 2>&1 && break
      sleep 1
    done
  fi
  curl -fsS --max-time 10 "http://127.0.0.1:$BROKER_PORT$path"
}

# cluster_ready N: the operator has seen the latest spec, the cluster is Ready with N ready
# brokers, and nothing is moving.
cluster_ready() {
  local want="$1" phase ready observed generation
  IFS='|' read -r phase ready observed generation < <(
    kc get mqcluster "$MQ" -o \
      jsonpath='{.status.phase}|{.status.brokers.ready}|{.status.observedGeneration}|{.metadata.generation}'
    echo
  )
  [[ "$phase" == Ready && "$ready" == "$want" && "$observed" == "$generation" ]]
}

# The broker ids holding replicas of the topic, space-separated and sorted.
replica_brokers() {
  broker_api "/api/v1/topics/$TOPIC" | python3 -c '
import json, sys
t = json.load(sys.stdin)
print(" ".join(str(b) for b in sorted({r for p in t["partitions"] for r in p["replicas"]})))'
}

# Every partition fully replicated (ISR = replicas = RF) with no move in progress, and
# (optionally) all replicas on the given broker ids.
topic_settled() {
  local allowed="${1:-}"
  broker_api "/api/v1/topics/$TOPIC" | ALLOWED="$allowed" python3 -c '
import json, os, sys
t = json.load(sys.stdin)
allowed = {int(x) for x in os.environ["ALLOWED"].split()}
ok = all(
    len(p["replicas"]) == t["replication_factor"]
    and sorted(p["isr"]) == sorted(p["replicas"])
    and not p["adding"] and not p["removing"]
    and p["leader"] in p["replicas"]
    and (not allowed or set(p["replicas"]) <= allowed)
    for p in t["partitions"]
)
sys.exit(0 if ok else 1)'
}

replicas_beyond() {  # some replica lives on a broker outside the given ids
  local old="$1" now
  now="$(replica_brokers)"
  python3 -c 'import sys; sys.exit(0 if set(sys.argv[2].split()) - set(sys.argv[1].split()) else 1)' "$old" "$now"
}

# produce_phase NAME: PER_PARTITION records to every partition, from the client pod (the
# REST API redirects to each partition's leader by its pod DNS name, which only resolves
# inside the cluster). Each value is unique; all are appended to expected.txt.
produce_phase() {
  local phase="$1" p attempt
  for ((p = 0; p < PARTITIONS; p++)); do
    seq 1 "$PER_PARTITION" | sed "s/^/$phase-p$p-/" >"$WORK/batch"
    for attempt in 1 2 3 4 5; do
      # A retry after a failed request may duplicate records (at-least-once), never lose them.
      if kc exec -i e2e-client -- strait produce "$TOPIC" --partition "$p" <"$WORK/batch" \
          >/dev/null 2>"$WORK/produce.err"; then
        break
      fi
      ((attempt < 5)) || die "produce $phase partition $p: $(cat "$WORK/produce.err")"
      log "produce $phase partition $p failed ($(tr -d '\n' <"$WORK/produce.err")); retrying"
      sleep 3
    done
    cat "$WORK/batch" >>"$WORK/expected.txt"
  done
  log "produced $((PARTITIONS * PER_PARTITION)) records ($phase)"
}

check_no_loss() {
  kc exec e2e-client -- strait consume "$TOPIC" --from-beginning >"$WORK/consumed.txt"
  sort -u "$WORK/expected.txt" >"$WORK/expected.sorted"
  sort -u "$WORK/consumed.txt" >"$WORK/consumed.sorted"
  local expected consumed missing unexpected
  expected=$(wc -l <"$WORK/expected.sorted")
  consumed=$(wc -l <"$WORK/consumed.txt")
  missing=$(comm -23 "$WORK/expected.sorted" "$WORK/consumed.sorted" | wc -l)
  unexpected=$(comm -13 "$WORK/expected.sorted" "$WORK/consumed.sorted" | wc -l)
  log "consumed $consumed records for $expected produced ($((consumed - expected)) duplicates)"
  if ((missing > 0)); then
    comm -23 "$WORK/expected.sorted" "$WORK/consumed.sorted" | head -20 >&2
    die "$missing acknowledged records are missing"
  fi
  ((unexpected == 0)) || die "$unexpected records that were never produced came back"
}

# --- preflight ----------------------------------------------------------------------------

for tool in docker kind kubectl helm curl python3; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH (see e2e/README.md)"
done
docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info); kind needs one"
kind get clusters 2>/dev/null | grep -qx "$CLUSTER" \
  && die "a kind cluster named $CLUSTER exists already; delete it or set E2E_CLUSTER"
trap cleanup EXIT

# --- cluster, image, chart ----------------------------------------------------------------

log "creating kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --config e2e/kind-config.yaml --wait 180s \
  ${NODE_IMAGE:+--image "$NODE_IMAGE"}

log "building $IMAGE"
DOCKER_BUILDKIT=1 docker build -t "$IMAGE" .
log "loading $IMAGE into the kind nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER"

cat >"$WORK/values.yaml" <<EOF
image:
  repository: $IMAGE_REPO
  tag: $IMAGE_TAG
  pullPolicy: IfNotPresent
cluster:
  enabled: true
  name: $MQ
  spec:
    brokers:
      replicas: 3
      storage: {size: 1Gi}
      resources:
        requests: {cpu: 100m, memory: 256Mi}
    controllers:
      storage: {size: 256Mi}
      resources:
        requests: {cpu: 50m, memory: 128Mi}
EOF
log "helm install $RELEASE (operator, CRDs, MQCluster $MQ)"
helm --kube-context "$CTX" install "$RELEASE" charts/straitmq --namespace "$NS" \
  --create-namespace --values "$WORK/values.yaml" --wait --timeout 5m
HTTP_PORT="$(kc get mqcluster "$MQ" -o jsonpath='{.spec.listeners.http.port}')"
[[ -n "$HTTP_PORT" ]] || die "the MQCluster has no spec.listeners.http.port (CRD default missing?)"

wait_for 900 "MQCluster $MQ Ready with 3 brokers" cluster_ready 3

# The operator's metrics, through its Service.
OP_PORT="$(free_port)"
port_forward "svc/$RELEASE-operator-metrics" "$OP_PORT:8090" operator
wait_for 60 "the operator's /metrics" \
  bash -c "curl -fsS --max-time 5 http://127.0.0.1:$OP_PORT/metrics | grep -q '^straitmq_operator_reconciles_total'"

# --- topic --------------------------------------------------------------------------------

log "kubectl apply -f examples/open/topic.yaml"
kc apply -f examples/open/topic.yaml
kc wait --for=condition=Ready "topic/$TOPIC" --timeout=300s
[[ "$(kc get topic "$TOPIC" -o jsonpath='{.status.partitions}')" == "$PARTITIONS" ]] \
  || die "topic $TOPIC does not report $PARTITIONS partitions"

log "starting the client pod (strait CLI from the same image)"
kc run e2e-client --image="$IMAGE" --image-pull-policy=IfNotPresent --restart=Never \
  --env="STRAIT_HTTP=http://$MQ-bootstrap:$HTTP_PORT" --command -- sleep infinity
kc wait --for=condition=Ready pod/e2e-client --timeout=120s

wait_for 120 "topic $TOPIC fully replicated" topic_settled
ORIGINAL_BROKERS="$(replica_brokers)"
log "replicas of $TOPIC are on brokers: $ORIGINAL_BROKERS"
[[ "$(wc -w <<<"$ORIGINAL_BROKERS")" == 3 ]] || die "expected replicas on 3 brokers"

: >"$WORK/expected.txt"
produce_phase before-scale

# --- scale 3 -> 5 -------------------------------------------------------------------------

log "kubectl scale mqcluster $MQ --replicas=5"
kc scale mqcluster "$MQ" --replicas=5
produce_phase during-scale-up   # while brokers join and partitions start to move
wait_for 900 "MQCluster $MQ Ready with 5 brokers" cluster_ready 5
wait_for 600 "partitions moved onto the new brokers" replicas_beyond "$ORIGINAL_BROKERS"
wait_for 600 "topic $TOPIC fully replicated after the scale up" topic_settled
log "replicas of $TOPIC are on brokers: $(replica_brokers)"
produce_phase after-scale-up

# --- scale 5 -> 3 -------------------------------------------------------------------------

log "kubectl scale mqcluster $MQ --replicas=3"
kc scale mqcluster "$MQ" --replicas=3
wait_for 900 "MQCluster $MQ Ready with 3 brokers" cluster_ready 3
wait_for 600 "replicas only on the remaining brokers" topic_settled "$ORIGINAL_BROKERS"
[[ "$(kc get statefulset "$MQ-broker" -o jsonpath='{.spec.replicas}')" == 3 ]] \
  || die "the broker StatefulSet was not shrunk to 3"
log "replicas of $TOPIC are on brokers: $(replica_brokers)"
produce_phase after-scale-down

# --- no message loss ----------------------------------------------------------------------

check_no_loss
