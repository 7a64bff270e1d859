#!/usr/bin/env bash
# Builds the container images the real-node tier runs, with no container registry:
#   localhost/straitmq-python:3.11  a Debian bookworm base with python3.11 and pip, made
#                                   here with mmdebstrap (stands in for python:3.11-slim)
#   localhost/straitmq:dev          the repository's own Dockerfile, unchanged, built by
#                                   buildah with --build-arg PYTHON_IMAGE=<the base above>
#                                   and STRAITMQ_COMMIT=<git rev-parse HEAD>; the same image
#                                   is also tagged localhost/straitmq:<version>
#                                   (straitmq.__version__, e.g. 0.2.0.dev0; in the node
#                                   too: tagged there after the import)
#   localhost/straitmq:<release>    each release of releases.toml (e.g. 0.1.0) from its own
#                                   source tree and Dockerfile (scripts/build-releases.sh
#                                   extracts it at its commit), with the flags and base of
#                                   the image above; built once: skipped while its tag is in
#                                   buildah's store (tests/test_real_node.py rolls from it)
#   localhost/pause:3.10            the pod sandbox image (a static Go binary that sleeps)
#   localhost/coredns:<version>     CoreDNS from .cache/k8s/bin/coredns (fetch-k8s.sh --node)
#   localhost/straitmq-client:dev   the tier's Kafka client pods: the base above plus
#                                   confluent-kafka (a test dependency, not in the app image)
#   localhost/local-path-provisioner:<version>  from .cache/k8s/bin (fetch-k8s.sh --node);
#                                   its helper pods run the Python base above (a shell)
#   localhost/spark:4.2.0           stands in for apache/spark:4.2.0-...-python3: the base
#                                   above + Debian's Java 17 + the pyspark wheel's Spark
#                                   (scripts/spark-base/: its layout and entrypoint)
#   localhost/straitmq-spark-jobs:dev  spark-jobs/k8s/Dockerfile, unchanged, on that base
# Each but the Spark base is saved as a docker-archive under .cache/images/ and, when the
# node's containerd runs (scripts/node-up.sh), imported into its k8s.io namespace.
# pip inside the build reaches the package index as the host does: host network, the
# host's pip config and CA bundle mounted read-only.
# Options: --force (rebuild everything),
#          --only NAME (base|straitmq|releases|pause|coredns|client|local-path|spark|spark-jobs).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
CACHE="$REPO/.cache/images"
BIN="$REPO/.cache/k8s/bin"
CTR_SOCK="${STRAITMQ_NODE_RUN:-/run/straitmq-node}/containerd/containerd.sock"
BUILDAH_RUN="${STRAITMQ_BUILDAH_RUN:-/run/straitmq-buildah}"  # buildah's runroot (locks, mounts)
# .cache/images is shared by every clone (scripts/bootstrap.sh): one build at a time.
mkdir -p "$CACHE"
exec 7>"$CACHE/.lock"
flock -w 3600 7 || { echo "build-images: timed out waiting for another build" >&2; exit 1; }
BASE_IMAGE="localhost/straitmq-python:3.11"
APP_IMAGE="localhost/straitmq:dev"
# The version of the code (the one constant, straitmq/__init__.py) and its commit (run as
# root on a checkout another user owns: git would refuse it as of "dubious ownership").
APP_VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' straitmq/__init__.py)"
[[ -n "$APP_VERSION" ]] || { echo "build-images: no __version__ in straitmq/__init__.py" >&2; exit 1; }
APP_VERSION_IMAGE="localhost/straitmq:$APP_VERSION"
APP_COMMIT="$(git -c safe.directory="$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
PAUSE_IMAGE="localhost/pause:3.10"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
COREDNS_IMAGE="localhost/coredns:${COREDNS_VERSION#v}"
CLIENT_IMAGE="localhost/straitmq-client:dev"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
LOCAL_PATH_IMAGE="localhost/local-path-provisioner:$LOCAL_PATH_VERSION"
SPARK_VERSION=4.2.0  # pyspark's version in requirements: the .venv's spark-submit submits
SPARK_IMAGE="localhost/spark:$SPARK_VERSION"
SPARK_JOBS_IMAGE="localhost/straitmq-spark-jobs:dev"
CONFLUENT_KAFKA_VERSION="${CONFLUENT_KAFKA_VERSION:-2.16.1}"
FORCE=0
ONLY=""
while (( $# )); do
  case "$1" in
    --force) FORCE=1 ;;
    --only) ONLY="$2"; shift ;;
    *) echo "usage: $0 [--force] [--only base|straitmq|releases|pause|coredns|client|local-path|spark|spark-jobs]" >&2
       exit 2 ;;
  esac
  shift
done

log() { echo "build-images: $*" >&2; }
die() { echo "build-images: $*" >&2; exit 1; }
[[ "$(id -u)" == 0 ]] || die "must run as root (buildah with kernel overlayfs and host network)"
for tool in buildah mmdebstrap go; do
  command -v "$tool" >/dev/null || die "$tool is missing (scripts/node-up.sh installs buildah and mmdebstrap)"
done
mkdir -p "$CACHE" "$BUILDAH_RUN"
BUILDAH=(buildah --root "$CACHE/buildah" --runroot "$BUILDAH_RUN" --storage-driver overlay)
want() { [[ -z "$ONLY" || "$ONLY" == "$1" ]]; }
step_t0=0
step() { step_t0=$SECONDS; log "$*"; }
done_step() { log "  done in $((SECONDS - step_t0))s"; }

# docker-archive tar of an image in buildah's store ($1 image, $2 tar path).
save() {
  rm -f "$2.tmp"
  "${BUILDAH[@]}" push --quiet "$1" "docker-archive:$2.tmp:$1" >/dev/null
  mv "$2.tmp" "$2"
}

# save, unless the tar already holds this very image (a multi-GB tar takes a while to
# write, and the node re-imports a tar whose mtime changed).
save_changed() {
  local id
  id="$("${BUILDAH[@]}" images --quiet --no-trunc "$1" | head -1)"
  if [[ -f "$2" && -f "$2.id" && "$(cat "$2.id")" == "$id" ]]; then return 0; fi
  save "$1" "$2"
  echo "$id" >"$2.id"
}

# --- the Python base: Debian bookworm + python3.11 + pip ----------------------------------
base_tar="$CACHE/straitmq-python-3.11.tar"
if want base && [[ $FORCE == 1 || ! -f "$base_tar" ]]; then
  step "$BASE_IMAGE: mmdebstrap bookworm with python3.11 (host's apt sources)"
  rootfs_tar="$CACHE/bookworm-python-rootfs.tar"
  # The host's own sources file: the same mirror apt uses here, named nowhere in this repo.
  sources=/etc/apt/sources.list.d/debian.sources
  [[ -f "$sources" ]] || sources=/etc/apt/sources.list
  [[ -f "$sources" ]] || die "no apt sources file on the host"
  nice -n 10 mmdebstrap --quiet --variant=minbase --mode=root --format=tar --skip=output/dev \
    --include=python3.11,python3-pip,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    bookworm "$rootfs_tar" "$sources"
  ctr_id="$("${BUILDAH[@]}" from --pull=never scratch)"
  "${BUILDAH[@]}" add --quiet "$ctr_id" "$rootfs_tar" / >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 \
    --label org.opencontainers.image.description="Debian bookworm with python3.11 and pip, made locally" \
    "$ctr_id"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr_id" "$BASE_IMAGE" >/dev/null
  save "$BASE_IMAGE" "$base_tar"
  rm -f "$rootfs_tar"
  done_step
fi

# pip inside a build: the host's pip settings and CA bundle, read-only.
vols=()
for f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
  [[ -f "$f" ]] && vols+=(--volume "$f:$f:ro")
done
pip_env=()
for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_CERT PIP_DEFAULT_TIMEOUT \
         HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  [[ -n "${!v:-}" ]] && pip_env+=(--env "$v=${!v}")
done

# --- StraitMQ from the repository's Dockerfile -------------------------------------------
app_tar="$CACHE/straitmq-dev.tar"
if want straitmq; then
  "${BUILDAH[@]}" images --quiet "$BASE_IMAGE" >/dev/null 2>&1 \
    || die "$BASE_IMAGE is not in buildah's store: run $0 --only base"
  step "$APP_IMAGE ($APP_VERSION_IMAGE): buildah bud -f Dockerfile --build-arg PYTHON_IMAGE=$BASE_IMAGE --build-arg STRAITMQ_COMMIT=$APP_COMMIT"
  # --layers: unchanged steps (the locked dependencies' wheels) are reused next time.
  nice -n 10 "${BUILDAH[@]}" bud --quiet --layers --pull=never --network host --format docker \
    "${vols[@]}" "${pip_env[@]+"${pip_env[@]}"}" \
    --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "STRAITMQ_COMMIT=$APP_COMMIT" \
    -f Dockerfile -t "$APP_IMAGE" . >&2
  "${BUILDAH[@]}" tag "$APP_IMAGE" "$APP_VERSION_IMAGE"
  save "$APP_IMAGE" "$app_tar"
  done_step
fi

# --- the releases of releases.toml, each from its own source and Dockerfile -------------------
# localhost/straitmq:<version>, for an MQCluster with spec.version: <version>. A release's
# tree never changes (its commit), so its image is built once: skipped while the tag is in
# buildah's store and its tar is saved (a warm run costs one `buildah images`). A release
# whose version is this code's own (a checkout at the release) is the app image above.
release_tars=()  # saved, for the node's import below
release_refs=()
if want releases; then
  py=.venv/bin/python
  [[ -x "$py" ]] || py=python3
  releases="$("$py" -c 'import tomllib
for v, r in tomllib.load(open("releases.toml", "rb"))["releases"].items(): print(v, r["commit"])')"
  while read -r version commit; do
    [[ -n "$version" ]] || continue
    [[ "$version" == "$APP_VERSION" ]] && continue
    ref="localhost/straitmq:$version"
    tar="$CACHE/straitmq-$version.tar"
    release_tars+=("$tar")
    release_refs+=("$ref")
    have=0
    [[ $FORCE == 0 ]] && "${BUILDAH[@]}" images --quiet "$ref" >/dev/null 2>&1 && have=1
    if (( have )) && [[ -f "$tar" ]]; then continue; fi
    if (( ! have )); then
      "${BUILDAH[@]}" images --quiet "$BASE_IMAGE" >/dev/null 2>&1 \
        || die "$BASE_IMAGE is not in buildah's store: run $0 --only base"
      step "$ref: release $version's own Dockerfile at $commit"
      # The release's source tree (extracted at its commit, with a virtualenv, once per
      # commit; cached). git may run as root on a checkout another user owns.
      rpy="$(GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0="$REPO" \
        nice -n 10 scripts/build-releases.sh --python "$version" | tail -1)"
      src="$(dirname "$(dirname "$(dirname "$rpy")")")/src"
      [[ -f "$src/Dockerfile" ]] || die "release $version: no Dockerfile in $src"
      # The app image's flags; STRAITMQ_COMMIT is the release's (a Dockerfile that does not
      # declare it, as 0.1.0's, ignores it).
      nice -n 10 "${BUILDAH[@]}" bud --quiet --layers --pull=never --network host --format docker \
        "${vols[@]}" "${pip_env[@]+"${pip_env[@]}"}" \
        --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "STRAITMQ_COMMIT=$commit" \
        -f "$src/Dockerfile" -t "$ref" "$src" >&2
    else
      step "$ref: saved again (its tar was missing)"
    fi
    save "$ref" "$tar"
    done_step
  done <<<"$releases"
fi

# --- the tier's Kafka client -------------------------------------------------------------------
client_tar="$CACHE/straitmq-client-dev.tar"
if want client && [[ $FORCE == 1 || ! -f "$client_tar" ]]; then
  "${BUILDAH[@]}" images --quiet "$BASE_IMAGE" >/dev/null 2>&1 \
    || die "$BASE_IMAGE is not in buildah's store: run $0 --only base"
  step "$CLIENT_IMAGE: $BASE_IMAGE + confluent-kafka $CONFLUENT_KAFKA_VERSION"
  mkdir -p "$CACHE/client"
  printf '%s\n' "FROM $BASE_IMAGE" \
    "RUN pip install --no-cache-dir --disable-pip-version-check --only-binary=:all: confluent-kafka==$CONFLUENT_KAFKA_VERSION" \
    "USER 10001:10001" >"$CACHE/client/Containerfile"
  nice -n 10 "${BUILDAH[@]}" bud --quiet --layers --pull=never --network host --format docker \
    "${vols[@]}" "${pip_env[@]+"${pip_env[@]}"}" -f "$CACHE/client/Containerfile" \
    -t "$CLIENT_IMAGE" "$CACHE/client" >&2
  save "$CLIENT_IMAGE" "$client_tar"
  done_step
fi

# --- pause ---------------------------------------------------------------------------------
pause_tar="$CACHE/pause-3.10.tar"
if want pause && [[ $FORCE == 1 || ! -f "$pause_tar" ]]; then
  step "$PAUSE_IMAGE: a static Go binary"
  src="$CACHE/pause-src"
  mkdir -p "$src"
  cat >"$src/main.go" <<'GO'
// pause: holds a pod's namespaces; exits on SIGINT/SIGTERM, reaps orphans (it is PID 1).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
GO
  printf 'module pause\n\ngo 1.21\n' >"$src/go.mod"
  ( cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o pause . )
  ctr_id="$("${BUILDAH[@]}" from --pull=never scratch)"
  "${BUILDAH[@]}" copy --quiet "$ctr_id" "$src/pause" /pause >/dev/null
  "${BUILDAH[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$ctr_id"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr_id" "$PAUSE_IMAGE" >/dev/null
  save "$PAUSE_IMAGE" "$pause_tar"
  done_step
fi

# --- CoreDNS ---------------------------------------------------------------------------------
coredns_tar="$CACHE/coredns-${COREDNS_VERSION#v}.tar"
if want coredns && [[ $FORCE == 1 || ! -f "$coredns_tar" ]]; then
  [[ -x "$BIN/coredns" ]] || die "$BIN/coredns is missing: run scripts/fetch-k8s.sh --node"
  step "$COREDNS_IMAGE from $BIN/coredns"
  ctr_id="$("${BUILDAH[@]}" from --pull=never scratch)"
  "${BUILDAH[@]}" copy --quiet "$ctr_id" "$BIN/coredns" /coredns >/dev/null
  "${BUILDAH[@]}" config --entrypoint '["/coredns"]' --port 53/udp --port 53/tcp "$ctr_id"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr_id" "$COREDNS_IMAGE" >/dev/null
  save "$COREDNS_IMAGE" "$coredns_tar"
  done_step
fi

# --- local-path-provisioner ----------------------------------------------------------------------
local_path_tar="$CACHE/local-path-provisioner-$LOCAL_PATH_VERSION.tar"
if want local-path && [[ $FORCE == 1 || ! -f "$local_path_tar" ]]; then
  [[ -x "$BIN/local-path-provisioner" ]] \
    || die "$BIN/local-path-provisioner is missing: run scripts/fetch-k8s.sh --node"
  step "$LOCAL_PATH_IMAGE from $BIN/local-path-provisioner"
  ctr_id="$("${BUILDAH[@]}" from --pull=never scratch)"
  "${BUILDAH[@]}" copy --quiet "$ctr_id" "$BIN/local-path-provisioner" \
    /usr/bin/local-path-provisioner >/dev/null
  "${BUILDAH[@]}" config --env PATH=/usr/bin --entrypoint '["/usr/bin/local-path-provisioner"]' \
    "$ctr_id"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr_id" "$LOCAL_PATH_IMAGE" >/dev/null
  save "$LOCAL_PATH_IMAGE" "$local_path_tar"
  done_step
fi

# --- Spark: a base like Apache Spark's image, and the jobs' image from its Dockerfile --------------
# Only the jobs' image runs on the node: the base stays in buildah's store, not saved as a
# tar (0.9 GB of disk a CI clone would otherwise spend twice).
if want spark && { [[ $FORCE == 1 ]] \
     || ! "${BUILDAH[@]}" images --quiet "$SPARK_IMAGE" >/dev/null 2>&1; }; then
  "${BUILDAH[@]}" images --quiet "$BASE_IMAGE" >/dev/null 2>&1 \
    || die "$BASE_IMAGE is not in buildah's store: run $0 --only base"
  step "$SPARK_IMAGE: $BASE_IMAGE + openjdk-17-jre-headless + pyspark $SPARK_VERSION"
  # The pyspark wheel, built on the host (PyPI has an sdist; pip's cache keeps the wheel).
  ctx="$CACHE/spark-base"
  rm -rf "$ctx" && mkdir -p "$ctx/wheels"
  cp scripts/spark-base/Containerfile scripts/spark-base/entrypoint.sh "$ctx/"
  nice -n 10 "$REPO/.venv/bin/pip" wheel --quiet --disable-pip-version-check \
    "pyspark==$SPARK_VERSION" -w "$ctx/wheels" >&2
  # apt inside the build: the host's sources (the base keeps them), host network.
  nice -n 10 "${BUILDAH[@]}" bud --quiet --layers --pull=never --network host --format docker \
    "${vols[@]}" "${pip_env[@]+"${pip_env[@]}"}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -f "$ctx/Containerfile" -t "$SPARK_IMAGE" "$ctx" >&2
  rm -rf "$ctx" "$CACHE/spark-$SPARK_VERSION.tar"
  done_step
fi
spark_jobs_tar="$CACHE/straitmq-spark-jobs-dev.tar"
if want spark-jobs; then
  "${BUILDAH[@]}" images --quiet "$SPARK_IMAGE" >/dev/null 2>&1 \
    || die "$SPARK_IMAGE is not in buildah's store: run $0 --only spark"
  ls .cache/jars/spark-kafka/*.jar >/dev/null 2>&1 \
    || die ".cache/jars/spark-kafka/ is empty: run scripts/fetch-jars.sh"
  step "$SPARK_JOBS_IMAGE: buildah bud -f spark-jobs/k8s/Dockerfile --build-arg SPARK_IMAGE=$SPARK_IMAGE"
  nice -n 10 "${BUILDAH[@]}" bud --quiet --layers --pull=never --network host --format docker \
    "${vols[@]}" "${pip_env[@]+"${pip_env[@]}"}" --build-arg "SPARK_IMAGE=$SPARK_IMAGE" \
    --ignorefile spark-jobs/k8s/Dockerfile.dockerignore \
    -f spark-jobs/k8s/Dockerfile -t "$SPARK_JOBS_IMAGE" . >&2
  save_changed "$SPARK_JOBS_IMAGE" "$spark_jobs_tar"
  done_step
fi

# --- into the node's containerd ---------------------------------------------------------------
if [[ -S "$CTR_SOCK" ]]; then
  CTR=(ctr --address "$CTR_SOCK" -n k8s.io)
  # A release's image never changes: imported only when the node lacks it.
  in_node="$("${CTR[@]}" images ls -q 2>/dev/null || true)"
  releases_missing=()
  for i in "${!release_tars[@]}"; do
    grep -qxF "${release_refs[$i]}" <<<"$in_node" || releases_missing+=("${release_tars[$i]}")
  done
  for tar in "$pause_tar" "$coredns_tar" "$app_tar" "$client_tar" "$local_path_tar" \
             "$spark_jobs_tar" "${releases_missing[@]+"${releases_missing[@]}"}"; do
    [[ -f "$tar" ]] || continue
    step "ctr import $(basename "$tar")"
    # A second try: containerd 1.6's collector can race an import's unpack (containerd#3787).
    "${CTR[@]}" images import "$tar" >/dev/null || "${CTR[@]}" images import "$tar" >/dev/null
    # The tar names the app image :dev only (one name per docker-archive): its version
    # tag too, for an MQCluster's spec.version.
    if [[ "$tar" == "$app_tar" ]]; then
      "${CTR[@]}" images tag --force "$APP_IMAGE" "$APP_VERSION_IMAGE" >/dev/null
    fi
    done_step
  done
else
  log "node's containerd is not running ($CTR_SOCK): images saved under $CACHE only"
fi
# Each rebuild leaves the previous image untagged (and a killed build its working
# container): without this the store grows by about 1 GB per change of the sources. Only
# untagged images without children go; --layers' cached steps have children and stay.
"${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true
"${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
"${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' >&2 || true
ls -l "$CACHE"/*.tar >&2 2>/dev/null || true
