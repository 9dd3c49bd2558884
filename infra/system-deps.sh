#!/usr/bin/env bash
# System packages a fresh Debian machine needs: PostgreSQL (the production-style catalog in
# tests), Java (Spark), Chromium (the report's browser test) and npm (the reports' offline web assets). Idempotent; installs only what is missing. Needs root (or sudo).
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)   # the report's browser test
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)      # pinned Data Docs assets (infra/web-assets)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Debian starts a cluster on install; icelog's tests start their own throwaway servers.
  $SUDO service postgresql stop >/dev/null 2>&1 || true
fi
