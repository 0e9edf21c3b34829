# Sourced by the install_*.sh scripts here: an npm install kept in a cache directory $DEST. A directory that holds
# the marker is a finished install (the marker is written last). Each run installs into its own temporary
# directory $tmp beside $DEST and renames it into place (rename(2) is atomic), so two runs at once are safe: the
# loser of the rename throws its copy away.

MARKER=.q4tune-install-complete

fail() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# Prints $1 and exits when $DEST holds a finished install.
exit_if_installed() {
  if [ -f "$DEST/$MARKER" ]; then
    echo "$1"
    exit 0
  fi
}

# Makes $tmp, removed when the script exits, with a package.json named $1 (which keeps npm from looking for one in
# a parent directory).
begin_install() {
  mkdir -p "$(dirname "$DEST")"
  tmp=$(mktemp -d "$DEST.tmp.XXXXXX")
  chmod 755 "$tmp"  # mktemp makes it private; the install is a shared cache
  trap 'rm -rf "$tmp"' EXIT
  echo "{\"name\": \"$1\", \"private\": true}" > "$tmp/package.json"
}

# Marks $tmp finished and renames it to $DEST; a rename that fails because another run finished first is fine.
finish_install() {
  touch "$tmp/$MARKER"
  if ! mv -T "$tmp" "$DEST" 2> /dev/null; then
    [ -f "$DEST/$MARKER" ] || fail "cannot move the install into $DEST (an incomplete directory is in the way? remove it)"
  fi
}
