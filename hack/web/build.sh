#!/usr/bin/env bash
# Builds the scratch pad (web/) into api/sandpod_gateway/pad/, which the gateway serves at /pad/:
# npm packages from the committed lockfile, bundled by esbuild. The gateway image builds it the
# same way (images/sandpod/Dockerfile); this is for a gateway run from the source tree.
#
#   hack/web/build.sh [--chromium]
#
# --chromium also installs Debian's Chromium (the browser tests drive it) when it is missing.
# Node.js and npm come from Debian when missing.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WEB_DIR=$REPO_ROOT/web
# apt-get that waits while another apt-get or dpkg holds its lock (hack/cluster/lib.sh).
source "$REPO_ROOT/hack/cluster/lib.sh"

log() { printf '[web %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

ensure_package() {
  local command=$1 package=$2
  command -v "$command" >/dev/null 2>&1 && return 0
  log "installing $package (for $command) from Debian"
  if [[ -z ${APT_UPDATED:-} ]]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
}

if [[ ${1:-} == --chromium ]]; then
  "$REPO_ROOT/hack/web/chromium.sh"
fi
ensure_package node nodejs
ensure_package npm npm

cd "$WEB_DIR"
# npm ci only when the lockfile changed since the last install (npm keeps a copy in node_modules).
if ! [[ node_modules/.package-lock.json -nt package-lock.json ]]; then
  log "installing npm packages (package-lock.json)"
  npm ci --no-audit --no-fund --loglevel=error
fi
npm run --silent build
