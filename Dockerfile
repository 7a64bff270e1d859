# syntax=docker/dockerfile:1
#
# One image for every StraitMQ process: `strait-broker`, `strait-controller`,
# `strait-operator` and the `strait` CLI. Kubernetes manifests (the operator's
# StatefulSets, the chart's Deployment) always set `command:`, so the default CMD below
# only matters for `docker run`: a single-node broker for trying StraitMQ out.
#
#   docker build --build-arg STRAITMQ_COMMIT=$(git rev-parse HEAD) -t straitmq:dev .
#   docker run --rm -p 9092:9092 -p 8080:8080 straitmq:dev
#   docker run --rm straitmq:dev strait-controller --help
#
# Reproducible: dependency versions come from requirements.lock (regenerate it with
# `.venv/bin/python scripts/lock_requirements.py`), the build backend is pinned, and the
# runtime stage installs offline from the wheels built here. For release builds also pin
# the base image: --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest>.
# Needs BuildKit (the default builder since Docker 23) for `RUN --mount`.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: wheels for StraitMQ and every locked dependency --------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src

# pyproject's `license = "Apache-2.0"` (PEP 639) needs setuptools >= 77; pinned so the
# wheel does not change with whatever setuptools is newest on build day.
RUN pip install setuptools==80.9.0

# Dependencies before sources: editing the code does not re-download them. Binary
# wheels only (all locked packages ship them for x86_64 and aarch64), so the build
# stage needs no compiler.
COPY requirements.lock ./
RUN pip wheel --only-binary=:all: --no-deps --wheel-dir /wheels -r requirements.lock

# The folders pyproject.toml maps into the `straitmq` namespace ([tool.setuptools]).
COPY pyproject.toml ./
COPY straitmq ./straitmq
COPY cli ./cli
COPY services ./services
COPY operator ./operator
COPY spark-jobs/straitmq_spark ./spark-jobs/straitmq_spark
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && cd /wheels && sha256sum *.whl >/src/wheels.sha256

# --- runtime ------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="StraitMQ" \
      org.opencontainers.image.description="Kafka-compatible message queue: broker, controller, operator and CLI" \
      org.opencontainers.image.licenses="Apache-2.0"

# Bytecode is compiled at install time below; at run time the root filesystem may be
# read-only (the chart sets readOnlyRootFilesystem), so Python must not try to write.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The hashes of the wheels installed below, kept in the image as a record of what it holds.
# Copying them first also ties the install step's cache to the wheels: a builder that keys
# a RUN's cache without the content of its bind mounts (buildah 1.28 with --layers) reused
# an install of stale sources after every code change.
COPY --from=build /src/wheels.sha256 /usr/local/share/straitmq/wheels.sha256

# Offline install from the build stage's wheels, constrained by the lock: a dependency
# missing from the lock fails the build instead of silently floating. The bind mount
# keeps the wheels out of the image's layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/src/requirements.lock,target=/requirements.lock \
    pip install --no-index --find-links=/wheels --constraint /requirements.lock straitmq \
    && pip check

# A fixed numeric uid/gid: Kubernetes' runAsNonRoot can only verify numeric users.
RUN groupadd --system --gid 10001 strait \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin strait \
    && mkdir -p /data \
    && chown 10001:10001 /data
USER 10001:10001
WORKDIR /data

# The commit the image is built from (`--build-arg STRAITMQ_COMMIT=$(git rev-parse HEAD)`;
# the build context holds no .git): `strait --version`, every process's startup log line
# and straitmq_build_info report it (straitmq/version.py). Declared after the steps that
# install, so that a new commit alone reuses their cached layers.
ARG STRAITMQ_COMMIT=unknown
ENV STRAITMQ_COMMIT=$STRAITMQ_COMMIT
LABEL org.opencontainers.image.revision=$STRAITMQ_COMMIT

# Kafka listener and HTTP (health, readiness, metrics, admin and REST API).
EXPOSE 9092 8080

# No ENTRYPOINT: every process of the image is its own console script, chosen by CMD
# (or by `command:` in Kubernetes).
ENTRYPOINT []
CMD ["strait-broker", "--data-dir", "/data", "--listen", "0.0.0.0:9092", \
     "--advertise", "127.0.0.1:9092", "--http", "0.0.0.0:8080"]
