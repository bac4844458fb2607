#!/usr/bin/env bash
# Installs Debian's Chromium when it is missing: the browser tests (the scratch pad's, the
# gateway's offline /docs) drive it through Playwright, which downloads no browser of its own.
set -euo pipefail

command -v chromium >/dev/null 2>&1 && exit 0
printf '[web %s] %s\n' "$(date +%H:%M:%S)" "installing chromium from Debian"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
