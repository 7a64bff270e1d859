#!/usr/bin/env bash
# Run a job on Kubernetes with plain spark-submit (no operator): the driver runs in a pod,
# and starts executor pods itself.
#
#   spark-jobs/k8s/spark-submit.sh event_windows.py --bootstrap straitmq-kafka.straitmq.svc:9092 \
#       --events events --results event-windows --out /data/ew/parquet --checkpoint /data/ew/ckpt
#
# Env: K8S_API (default: the current kubectl context's server), NAMESPACE (spark-jobs),
#      IMAGE (straitmq-spark-jobs:0.1.0), EXECUTORS (2), SPARK_SUBMIT (spark-submit of a
#      Spark 4.2.0 install; `pip install pyspark==4.2.0` provides one).
# Needs rbac.yaml and storage.yaml applied in NAMESPACE first.
set -euo pipefail

job="${1:?usage: $0 <job.py> [job args...]}"; shift
K8S_API="${K8S_API:-$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')}"
NAMESPACE="${NAMESPACE:-spark-jobs}"
IMAGE="${IMAGE:-straitmq-spark-jobs:0.1.0}"
EXECUTORS="${EXECUTORS:-2}"
vol=spark.kubernetes.driver.volumes.persistentVolumeClaim.data
evol=spark.kubernetes.executor.volumes.persistentVolumeClaim.data

exec "${SPARK_SUBMIT:-spark-submit}" \
    --master "k8s://${K8S_API}" \
    --deploy-mode cluster \
    --name "${job%.py}" \
    --conf spark.kubernetes.namespace="$NAMESPACE" \
    --conf spark.kubernetes.container.image="$IMAGE" \
    --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
    --conf spark.executor.instances="$EXECUTORS" \
    --conf spark.kubernetes.pyspark.pythonVersion=3 \
    --conf spark.sql.session.timeZone=UTC \
    --conf spark.sql.execution.pyspark.udf.hideTraceback.enabled=true \
    --conf "$vol.options.claimName=spark-data" --conf "$vol.mount.path=/data" \
    --conf "$evol.options.claimName=spark-data" --conf "$evol.mount.path=/data" \
    "local:///opt/spark-jobs/jobs/$job" "$@"
