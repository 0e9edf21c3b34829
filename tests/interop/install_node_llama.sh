#!/usr/bin/env bash
# Installs llama.cpp's CPU prebuilt from npm (node-llama-cpp + @node-llama-cpp/linux-x64, ≈85 MB), the reference
# that tests/interop/llama_ref.mjs runs, and prints the directory it lives in (DIR/node_modules/node-llama-cpp).
#   Q4T_NODE_CACHE   where to install (default ${XDG_CACHE_HOME:-$HOME/.cache}/q4tune/node-llama-cpp-3.22.1)
# Does nothing when a complete install is already there. Two runs at once are safe: each installs into its own
# temporary directory and renames it into place; the loser of the rename throws its copy away.
# Needs node >= 20 and npm, and the npm registry the first time.
set -euo pipefail

VERSION=3.22.1
DEST=${Q4T_NODE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/q4tune/node-llama-cpp-$VERSION}
source "$(dirname "$0")/npm_cache.sh"

exit_if_installed "$DEST"
command -v node > /dev/null ||
  fail "node is not installed: install Node.js >= 20 and npm (Debian: apt-get install nodejs npm)"
command -v npm > /dev/null || fail "npm is not installed: install it beside node (Debian: apt-get install npm)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || fail "node-llama-cpp $VERSION needs node >= 20, found $(node --version)"
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] ||
  fail "only the linux-x64 prebuilt is installed here; this machine is $(uname -s)-$(uname -m)"

begin_install q4tune-llama-cpp-reference
# SKIP_DOWNLOAD: the postinstall must not fetch or compile llama.cpp sources. --omit=optional drops the other
# platforms' and the GPU prebuilts that node-llama-cpp lists as optional; the CPU one is named explicitly.
if ! (cd "$tmp" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --no-audit --no-fund \
        --loglevel=error "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION") >&2; then
  fail "npm install of node-llama-cpp@$VERSION failed (is the npm registry reachable?)"
fi
if [ ! -f "$tmp/node_modules/node-llama-cpp/package.json" ] || [ ! -d "$tmp/node_modules/@node-llama-cpp/linux-x64/bins" ]; then
  fail "npm install reported success but did not install node-llama-cpp and @node-llama-cpp/linux-x64"
fi
finish_install
echo "$DEST"
