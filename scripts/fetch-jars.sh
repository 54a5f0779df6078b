#!/usr/bin/env bash
# Resolve the jars of jars/pom.xml from Maven Central and keep only those PySpark does not
# already ship (same artifact, any version): a second Jackson or Hadoop on the classpath
# breaks Spark in subtle ways.
set -euo pipefail
venv_python=$1
dest=$2
pyspark_jars=$("$venv_python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
mvn -q -B -f jars/pom.xml dependency:copy-dependencies \
    -DoutputDirectory="$staging" -DincludeScope=runtime
shipped=$(ls "$pyspark_jars")
rm -rf "$dest" && mkdir -p "$dest"
for jar in "$staging"/*.jar; do
    artifact=$(basename "$jar" .jar | sed -E 's/-[0-9][0-9A-Za-z.-]*$//')
    if ! grep -q "^${artifact}-[0-9]" <<<"$shipped"; then
        cp "$jar" "$dest/"
    fi
done
touch "$dest/.complete"
echo "jars cached in $dest: $(ls "$dest" | wc -l) files"
