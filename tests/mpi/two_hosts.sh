#!/usr/bin/env bash
# Open MPI across two simulated hosts on this machine: network namespaces q4t-hostA (10.99.0.1) and q4t-hostB
# (10.99.0.2), joined by a veth pair, each with its own hostname. mpirun runs in q4t-hostA and starts the orted of
# q4t-hostB through netns_agent.sh (in place of ssh), so the launch and all MPI traffic are TCP over the veth.
#   tests/mpi/two_hosts.sh NP_PER_HOST COMMAND...   # mpirun -np 2*NP_PER_HOST ... COMMAND...
# Needs root, iproute2 and util-linux (unshare, flock). Extra mpirun options go in MPIRUN_ARGS (split on spaces).
set -euo pipefail
np_per_host=${1:?usage: two_hosts.sh NP_PER_HOST COMMAND...}
shift
[ $# -gt 0 ] || { echo "usage: two_hosts.sh NP_PER_HOST COMMAND..." >&2; exit 2; }
case "$np_per_host" in '' | *[!0-9]* | 0) echo "two_hosts.sh: NP_PER_HOST must be a positive integer" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
subnet=10.99.0.0/24

[ "$(id -u)" = 0 ] || { echo "two_hosts.sh: needs root (ip netns, veth)" >&2; exit 1; }
command -v ip >/dev/null || { echo "two_hosts.sh: needs iproute2 (ip)" >&2; exit 1; }

# One run at a time: a second would tear down the first one's namespaces.
exec 9>/run/lock/q4t-two-hosts.lock
flock -n 9 || { echo "two_hosts.sh: another run holds /run/lock/q4t-two-hosts.lock" >&2; exit 1; }

cleanup() {
  ip netns del q4t-hostA 2>/dev/null || true
  ip netns del q4t-hostB 2>/dev/null || true
  ip link del q4t-vA 2>/dev/null || true # left in the root namespace by a run stopped mid-setup
  rm -f "${hostfile:-}"
}
cleanup # leftovers of an aborted run
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add q4t-hostA || { echo "two_hosts.sh: cannot create network namespaces here" >&2; exit 1; }
ip netns add q4t-hostB
ip link add q4t-vA type veth peer name q4t-vB
ip link set q4t-vA netns q4t-hostA
ip link set q4t-vB netns q4t-hostB
ip -n q4t-hostA addr add 10.99.0.1/24 dev q4t-vA
ip -n q4t-hostB addr add 10.99.0.2/24 dev q4t-vB
for side in A B; do
  ip -n q4t-host$side link set lo up
  ip -n q4t-host$side link set q4t-v$side up
done

hostfile=$(mktemp /tmp/q4t-hostfile.XXXXXX)
printf '10.99.0.1 slots=%s\n10.99.0.2 slots=%s\n' "$np_per_host" "$np_per_host" >"$hostfile"

# shellcheck disable=SC2086
ip netns exec q4t-hostA unshare --uts sh -c 'hostname q4t-hostA && exec "$@"' sh \
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np $((2 * np_per_host)) --hostfile "$hostfile" \
  --mca plm_rsh_agent "$here/netns_agent.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
  ${MPIRUN_ARGS:-} "$@"
