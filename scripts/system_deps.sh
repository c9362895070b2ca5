#!/usr/bin/env bash
# Installs the system packages the tests use (PostgreSQL server, headless Chromium, Node.js, mksh:
# Android's shell, for what it prints when a command dies of a signal) from
# Debian when they are missing. Idempotent and quiet when everything is already there.
set -euo pipefail
need=()
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
{ [ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ]; } || command -v initdb >/dev/null || need+=(postgresql)
command -v chromium >/dev/null || need+=(chromium)
command -v node >/dev/null || need+=(nodejs npm)
command -v mksh >/dev/null || need+=(mksh)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]} (run: sudo apt-get install -y ${need[*]})" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
