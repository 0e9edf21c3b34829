#!/usr/bin/env bash
# Open MPI's remote launcher for tests/mpi/two_hosts.sh, in place of ssh: `netns_agent.sh [-opts] HOST WORDS...`
# runs WORDS through sh inside the q4t-host* network namespace that owns address HOST, as sshd would run them,
# with a fresh environment and that namespace's own hostname (a UTS namespace named after it).
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host=${1:?usage: netns_agent.sh HOST COMMAND...}
shift
for ns in $(ip netns list | awk '$1 ~ /^q4t-host/ { print $1 }'); do
  if ip -n "$ns" -o -4 addr show | awk '{ sub("/.*", "", $4); print $4 }' | grep -qxF "$host"; then
    # shellcheck disable=SC2016 # $0 and $1 belong to the inner sh
    exec ip netns exec "$ns" unshare --uts \
      env -i HOME="${HOME:-/root}" PATH=/usr/local/bin:/usr/bin:/bin USER=root SHELL=/bin/sh \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
  fi
done
echo "netns_agent.sh: no q4t-host* namespace owns address $host" >&2
exit 255
