#!/usr/bin/env bash
# Installs a Debian package unless the file it provides is there already.
#   install-debian.sh PACKAGE FILE   (FILE may be a glob, e.g. /usr/lib/postgresql/*/bin/pg_ctl)
# chromium drives the browser tests; postgresql is `lakehouse services start postgres`;
# docker-compose checks docker/compose.yaml (no engine needed).
set -euo pipefail
package=$1
provided=$2
if compgen -G "$provided" >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
    command -v sudo >/dev/null || {
        echo "$package is missing and installing it needs root: apt-get install $package" >&2
        exit 1
    }
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "$package" >/dev/null
compgen -G "$provided" >/dev/null
