#!/usr/bin/env bash
# Installs Debian's Chromium when it is missing: the browser tests (the scratch pad's, the
# gateway's offline /docs) drive it through Playwright, which downloads no browser of its own.
set -euo pipefail
# apt-get that waits while another apt-get or dpkg holds its lock (hack/cluster/lib.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"

command -v chromium >/dev/null 2>&1 && exit 0
printf '[web %s] %s\n' "$(date +%H:%M:%S)" "installing chromium from Debian"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
