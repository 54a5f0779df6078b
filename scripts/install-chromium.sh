#!/usr/bin/env bash
# Installs Debian's chromium (headless browser for the report test) unless it is there.
set -euo pipefail
if command -v chromium >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
    command -v sudo >/dev/null || {
        echo "chromium is missing and installing it needs root: apt-get install chromium" >&2
        exit 1
    }
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
