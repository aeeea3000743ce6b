#!/usr/bin/env bash
# Runs the whole test suite. Installs what the tests run for real (Debian packages) first when it is missing:
# redis-server and redis-tools (real Redis servers and a real Redis Cluster on loopback) and haproxy (a real load
# balancer in front of two gateways for the rolling restart tests), curl (the README's tour, run as written; HTTPS
# over HTTP/1.1 and HTTP/2), openssl (its s_client for SNI, TLS versions and client certificates),
# prometheus for its promtool (the shipped alert rules and dashboard queries are checked by it; its service is not
# started by the tests) and chromium (the admin dashboard read in a real browser); these two without the packages
# they merely recommend.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  missing+=(redis-server redis-tools)
fi
# Debian installs haproxy in /usr/sbin, which a non-root PATH may lack; the tests look there too.
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  missing+=(haproxy)
fi
if ! command -v curl >/dev/null 2>&1; then
  missing+=(curl)
fi
if ! command -v openssl >/dev/null 2>&1; then
  missing+=(openssl)
fi
# h2load: HTTP/2 load over TLS through the gateway (tests/tls.rs), as operators test it.
if ! command -v h2load >/dev/null 2>&1; then
  missing+=(nghttp2-client)
fi
bare=()
if ! command -v promtool >/dev/null 2>&1; then
  bare+=(prometheus)
fi
if ! command -v chromium >/dev/null 2>&1; then
  bare+=(chromium)
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#bare[@]} -gt 0 ]; then
  echo "tollgate tests: installing ${missing[*]} ${bare[*]} with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ ${#bare[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${bare[@]}" >/dev/null
  fi
fi

cargo test "$@"
