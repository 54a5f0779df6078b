#!/usr/bin/env bash
# Installs Debian packages, each unless the file it provides is there already, with one
# package-list update and one install for all that are missing.
#   install-debian.sh PACKAGE FILE [PACKAGE FILE ...]   (FILE may be a glob, e.g.
#   '/usr/lib/postgresql/*/bin/pg_ctl')
# chromium drives the browser tests; postgresql is `lakehouse services start postgres`;
# docker-compose checks docker/compose.yaml (no engine needed).
set -euo pipefail
if (( $# == 0 || $# % 2 )); then
    echo "usage: install-debian.sh PACKAGE FILE [PACKAGE FILE ...]" >&2
    exit 2
fi
missing=()
provided=()
while (( $# )); do
    if ! compgen -G "$2" >/dev/null; then
        missing+=("$1")
        provided+=("$2")
    fi
    shift 2
done
if (( ${#missing[@]} == 0 )); then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
    command -v sudo >/dev/null || {
        echo "${missing[*]} missing, and installing needs root: apt-get install ${missing[*]}" >&2
        exit 1
    }
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
for file in "${provided[@]}"; do
    compgen -G "$file" >/dev/null || { echo "installed, but $file is not there" >&2; exit 1; }
done
