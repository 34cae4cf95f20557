#!/usr/bin/env bash
# The project's Spark entry points against a Spark cluster, with object-store paths (s3a://).
#
#   infra/cluster/spark-submit.sh standalone etl/prepare.py --dataset yahoo \
#       --input s3a://BUCKET/raw/yahoo/ --output s3a://BUCKET/prepared/yahoo
#   infra/cluster/spark-submit.sh k8s evaluation/score.py --model models:/nce-autorec@champion \
#       --mlflow-uri http://mlflow:5000 --data s3a://BUCKET/prepared/yahoo --output s3a://BUCKET/recs/yahoo
#   infra/cluster/spark-submit.sh standalone evaluation/evaluate.py --recs s3a://BUCKET/recs/yahoo \
#       --data s3a://BUCKET/prepared/yahoo --output s3a://BUCKET/eval/yahoo --mlflow-uri http://mlflow:5000
#
# Environment:
#   SPARK_MASTER    spark://HOST:7077 (standalone) or k8s://https://API:6443 (Kubernetes)
#   PYENV_ARCHIVE   standalone: a packed Python environment for the executors
#                   (venv-pack -p .venv -o nce-venv.tar.gz; default ./nce-venv.tar.gz)
#   IMAGE           k8s: the image of infra/cluster/Dockerfile (default REGISTRY/nce-autorec:0.1.0)
#   EXECUTORS, EXECUTOR_CORES, EXECUTOR_MEMORY, DRIVER_MEMORY: sizes (defaults 4, 4, 16g, 8g)
# S3 credentials come from the default AWS chain (instance profile, IRSA, or AWS_* variables).
set -euo pipefail
mode=${1:?usage: $0 standalone|k8s SCRIPT [ARGS...]}
script=${2:?usage: $0 standalone|k8s SCRIPT [ARGS...]}
shift 2
case "$script" in
  etl/prepare.py|evaluation/score.py|evaluation/evaluate.py) ;;
  *) echo "SCRIPT must be etl/prepare.py, evaluation/score.py or evaluation/evaluate.py" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/../.." && pwd)
common=(
  --conf spark.executor.instances="${EXECUTORS:-4}"
  --conf spark.executor.cores="${EXECUTOR_CORES:-4}"
  --conf spark.task.cpus=1
  --conf spark.executor.memory="${EXECUTOR_MEMORY:-16g}"
  --driver-memory "${DRIVER_MEMORY:-8g}"
  # s3a:// through hadoop-aws (the version of Spark 4.x's Hadoop client)
  --packages org.apache.hadoop:hadoop-aws:3.4.1
  --conf spark.hadoop.fs.s3a.aws.credentials.provider=software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider
  --conf spark.hadoop.fs.s3a.fast.upload=true
  # the output is published by a rename: on S3 a copy, so use the magic committer for Parquet
  --conf spark.hadoop.fs.s3a.committer.name=magic
  --conf spark.sql.sources.commitProtocolClass=org.apache.spark.internal.io.cloud.PathOutputCommitProtocol
  --conf spark.sql.parquet.output.committer.class=org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter
)
case "$mode" in
  standalone)
    master=${SPARK_MASTER:?set SPARK_MASTER=spark://HOST:7077}
    archive=${PYENV_ARCHIVE:-nce-venv.tar.gz}
    exec spark-submit --master "$master" --deploy-mode client "${common[@]}" \
      --archives "$archive#env" --conf spark.pyspark.python=./env/bin/python \
      --conf spark.pyspark.driver.python="$root/.venv/bin/python" \
      "$root/$script" "$@" ;;
  k8s)
    master=${SPARK_MASTER:?set SPARK_MASTER=k8s://https://API:6443}
    exec spark-submit --master "$master" --deploy-mode cluster "${common[@]}" \
      --conf spark.kubernetes.container.image="${IMAGE:-REGISTRY/nce-autorec:0.1.0}" \
      --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
      --conf spark.pyspark.python=python3 \
      "local:///home/ray/nce-autorec/$script" "$@" ;;
  *) echo "mode must be standalone or k8s" >&2; exit 2 ;;
esac
