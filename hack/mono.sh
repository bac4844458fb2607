#!/usr/bin/env bash
# Installs Debian's Mono compiler and runtime when they are missing: the runner's C# tests
# (images/runner/internal/csharp) build and run what its top-level-statements step writes with
# the real mcs and mono, as the csharp image does.
set -euo pipefail
# apt-get that waits while another apt-get or dpkg holds its lock (hack/cluster/lib.sh).
source "$(dirname "${BASH_SOURCE[0]}")/cluster/lib.sh"

command -v mcs >/dev/null 2>&1 && command -v mono >/dev/null 2>&1 && exit 0
printf '[mono %s] %s\n' "$(date +%H:%M:%S)" "installing mono-mcs and mono-runtime from Debian"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    mono-mcs mono-runtime >/dev/null
