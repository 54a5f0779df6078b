#!/usr/bin/env bash
# Resolve the jars of a pom from Maven Central into a folder of their own.
#   fetch-jars.sh POM DEST [VENV_PYTHON]
# With VENV_PYTHON (the jars Spark loads beside PySpark's own), keep only those PySpark does
# not already ship (same artifact, any version): a second Jackson or Hadoop on the classpath
# breaks Spark in subtle ways. Without it (the Kafka broker), keep them all.
set -euo pipefail
pom=$1
dest=$2
venv_python=${3:-}
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DoutputDirectory="$staging" -DincludeScope=runtime
shipped=""
if [[ -n $venv_python ]]; then
    pyspark_jars=$("$venv_python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
    shipped=$(ls "$pyspark_jars")
fi
rm -rf "$dest" && mkdir -p "$dest"
for jar in "$staging"/*.jar; do
    artifact=$(basename "$jar" .jar | sed -E 's/-[0-9][0-9A-Za-z.-]*$//')
    if [[ -z $shipped ]] || ! grep -q "^${artifact}-[0-9]" <<<"$shipped"; then
        cp "$jar" "$dest/"
    fi
done
touch "$dest/.complete"
echo "jars cached in $dest: $(ls "$dest" | wc -l) files"
