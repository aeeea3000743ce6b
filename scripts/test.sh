#!/usr/bin/env bash
# Runs the whole test suite. Installs redis-server (Debian package) first when it is missing: the tests start
# real Redis servers and a real Redis Cluster on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "tollgate tests: installing redis-server and redis-tools with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi

cargo test "$@"
