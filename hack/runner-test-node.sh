#!/usr/bin/env bash
# Installs the node image's own packages (images/node/package.json: Node.js 24 as npm ships it,
# acorn) into a cache when its lockfile changed: the runner's session-kernel tests
# (images/runner/internal/runner/node_session_test.go) run kernel.mjs with that node and acorn,
# as the node image does. Prints nothing but errors; the Makefile passes the paths on.
#
#   hack/runner-test-node.sh DIR
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# apt-get that waits while another apt-get or dpkg holds its lock (hack/cluster/lib.sh).
source "$REPO_ROOT/hack/cluster/lib.sh"
SOURCE=$REPO_ROOT/images/node
TARGET=${1:?usage: hack/runner-test-node.sh DIR}

if ! command -v npm >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
mkdir -p "$TARGET"
if cmp -s "$SOURCE/package-lock.json" "$TARGET/package-lock.json" && [[ -d $TARGET/node_modules ]]; then
  exit 0
fi
printf '[runner-test-node %s] %s\n' "$(date +%H:%M:%S)" "installing the node image's packages into $TARGET"
cp "$SOURCE/package.json" "$SOURCE/package-lock.json" "$TARGET/"
(cd "$TARGET" && npm ci --omit=dev --no-audit --no-fund --loglevel=error)
