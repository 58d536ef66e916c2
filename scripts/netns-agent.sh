#!/bin/sh
# Open MPI's launch agent for test hosts that are network namespaces of one machine, in place of ssh:
#
#   mpirun --mca plm_rsh_agent scripts/netns-agent.sh --host 198.18.0.1:1,198.18.0.2:1 ...
#
# mpirun calls its agent as it calls ssh, `AGENT [OPTIONS] HOST COMMAND...`, where COMMAND is a shell
# command line (it starts Open MPI's daemon, orted). This runs COMMAND with `ip netns exec` in the network
# namespace HOST names, in a UTS namespace of its own whose host name is the namespace's name, so that each
# test host has a name of its own (MPI_Get_processor_name, the ranks' messages). HOST is looked up as
#   1. an address in GPUNODES_NETNS_HOSTS ("198.18.0.1=gn-a-123 198.18.0.2=gn-b-123"),
#   2. the name of a network namespace,
#   3. an address that exactly one network namespace holds.
# Needs root (ip netns exec, unshare). tests/dist/two_hosts.sh uses it; docs/distributed.md, "Across hosts".
set -eu
while [ $# -gt 0 ]; do
  case $1 in
    -[io]) shift 2 ;;  # ssh options with a value, should Open MPI ever pass one
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "netns-agent.sh: usage: netns-agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
ns=""
for pair in ${GPUNODES_NETNS_HOSTS:-}; do
  if [ "${pair%%=*}" = "$host" ]; then ns=${pair#*=}; fi
done
if [ -z "$ns" ] && ip netns list | awk '{print $1}' | grep -qxF "$host"; then ns=$host; fi
if [ -z "$ns" ]; then
  holders=""
  for n in $(ip netns list | awk '{print $1}'); do
    if ip -n "$n" -o -4 addr show 2>/dev/null | awk '{print $4}' | grep -qx "$host/[0-9]*"; then
      holders="$holders $n"
    fi
  done
  count=$(echo $holders | wc -w)
  if [ "$count" -ne 1 ]; then
    echo "netns-agent.sh: no single network namespace for host $host (found: ${holders:- none})" >&2
    exit 255
  fi
  ns=$(echo $holders)
fi
# ip netns exec and unshare exec what follows; setsid -f starts the shell (and the daemon under it) in a
# session and process tree of their own and returns. So, as under sshd on a real host, nothing that happens
# to mpirun's processes (SIGKILL, Open MPI's parent-death signals) reaches the far host's processes except
# through the network: the test sees what a real far host would do.
exec ip netns exec "$ns" unshare --uts setsid -f sh -c 'hostname "$0" || exit 255; eval "$*"' "$ns" "$@"
