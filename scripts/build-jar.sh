#!/usr/bin/env bash
# Compile one of the project's Java sources (jars/NAME/src: the Delta log store for local
# disk, silver's record reader) into lakehouse-NAME.jar beside the other jars Spark loads,
# against PySpark's own jars and the cached Delta jars.
#   build-jar.sh NAME JARS_DIR VENV_PYTHON
set -euo pipefail
name=$1
jars_dir=$2
venv_python=$3
pyspark_jars=$("$venv_python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
javac --release 17 -nowarn -cp "$pyspark_jars/*:$jars_dir/*" -d "$classes" \
    "$(dirname "$0")/../jars/$name/src/lakehouse/"*.java
jar cf "$jars_dir/lakehouse-$name.jar.part" -C "$classes" .
mv "$jars_dir/lakehouse-$name.jar.part" "$jars_dir/lakehouse-$name.jar"
echo "$name built in $jars_dir/lakehouse-$name.jar"
