#!/usr/bin/env bash
# Compile the project's Delta log store for local disk (jars/logstore) into a jar beside the
# other jars Spark loads, against PySpark's Hadoop and the cached Delta jars.
#   build-logstore.sh JARS_DIR VENV_PYTHON
set -euo pipefail
jars_dir=$1
venv_python=$2
pyspark_jars=$("$venv_python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac --release 17 -nowarn -cp "$pyspark_jars/*:$jars_dir/*" -d "$classes" \
    "$(dirname "$0")"/../jars/logstore/src/lakehouse/*.java
jar cf "$jars_dir/lakehouse-logstore.jar.part" -C "$classes" .
mv "$jars_dir/lakehouse-logstore.jar.part" "$jars_dir/lakehouse-logstore.jar"
echo "log store built in $jars_dir/lakehouse-logstore.jar"
