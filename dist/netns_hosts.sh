#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two (or more) simulated hosts on one Linux machine, for trying multi-host training over TCP: each
# host is a network namespace with one end of a veth pair on a private test subnet, and mpirun
# reaches the others through a launch agent that runs its daemon with `ip netns exec` where Open
# MPI would use ssh. Needs root (ip netns) and iproute2. Read it as a recipe for real hosts too:
# the hostfile, the interface selection (btl_tcp_if_include, oob_tcp_if_include) and the agent
# are what a cluster launch needs.
#
#   dist/netns_hosts.sh up PREFIX N        makes namespaces PREFIX1..PREFIXN on 10.77.0.0/24,
#                                          joined by a bridge-less chain of veth pairs to host 1
#   dist/netns_hosts.sh down PREFIX N      removes them (and their links)
#   dist/netns_hosts.sh agent PREFIX       writes PREFIX.agent: the rsh stand-in for plm_rsh_agent
#   dist/netns_hosts.sh mpirun PREFIX N -- PROGRAM ARGS...
#                                          runs `mpirun -n N` from host 1, one rank a host, over TCP
#   dist/netns_hosts.sh link PREFIX K up|down   takes host K's link (K >= 2) up or down (a partition)
#   dist/netns_hosts.sh slow PREFIX K DELAY_MS RATE_MBIT [LOSS]
#                                          routes host 1 <-> host K through a user-space link with
#                                          that one-way delay, rate and loss share (0..1): the
#                                          netns_link program (NETNS_LINK, default build/netns_link),
#                                          for kernels without tc netem
#   dist/netns_hosts.sh fast PREFIX K      back to the plain veth
#
# Host k has address 10.77.0.k. Each host k >= 2 has its own veth pair to host 1 (a star), so a
# link can be cut for one host alone.
set -euo pipefail
cmd=${1:-}
prefix=${2:-}
[ -n "$cmd" ] && [ -n "$prefix" ] || { sed -n '3,27p' "$0"; exit 2; }
addr() { echo "10.77.0.$1"; }

case $cmd in
up)
    n=${3:?N}
    for k in $(seq 1 "$n"); do
        ip netns add "$prefix$k"
        ip -n "$prefix$k" link set lo up
    done
    for k in $(seq 2 "$n"); do # host 1 <-> host k
        ip link add "${prefix}a$k" type veth peer name "${prefix}b$k"
        ip link set "${prefix}a$k" netns "${prefix}1"
        ip link set "${prefix}b$k" netns "$prefix$k"
        ip -n "${prefix}1" addr add "$(addr 1)/32" dev "${prefix}a$k" 2>/dev/null || true
        ip -n "${prefix}1" link set "${prefix}a$k" up
        ip -n "${prefix}1" route add "$(addr "$k")/32" dev "${prefix}a$k"
        ip -n "$prefix$k" addr add "$(addr "$k")/32" dev "${prefix}b$k"
        ip -n "$prefix$k" link set "${prefix}b$k" up
        ip -n "$prefix$k" route add "$(addr 1)/32" dev "${prefix}b$k"
    done
    ;;
down)
    n=${3:?N}
    for k in $(seq 2 "$n"); do "$0" fast "$prefix" "$k"; done
    for k in $(seq 1 "$n"); do ip netns del "$prefix$k" 2>/dev/null || true; done
    ;;
agent)
    # Open MPI calls the agent as `agent HOST COMMAND...` (as it would call ssh); the host is an
    # address of the hostfile, the command a shell line that starts orted.
    cat > "$prefix.agent" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in 10.77.0.*) ns="$prefix\${host##*.}" ;; *) echo "netns agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
    chmod +x "$prefix.agent"
    ;;
mpirun)
    n=${3:?N}
    shift 3
    [ "${1:-}" = "--" ] && shift
    hostfile=$(mktemp)
    for k in $(seq 1 "$n"); do echo "$(addr "$k") slots=1"; done > "$hostfile"
    [ -x "$prefix.agent" ] || "$0" agent "$prefix"
    root=()
    [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    # TCP only (no shared memory between the "hosts"), on the test subnet for both the data (btl)
    # and the runtime's own connections (oob). --bind-to none: each daemon would bind its rank to
    # its "host's" first core, and the hosts share this machine's cores, so every rank would run
    # on core 0 (real hosts do not need it).
    set +e
    ip netns exec "${prefix}1" mpirun "${root[@]}" --hostfile "$hostfile" -n "$n" --map-by node --bind-to none \
        --mca plm_rsh_agent "$PWD/$prefix.agent" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca oob_tcp_if_include 10.77.0.0/24 "$@" &
    mp=$!
    # The watchdog a launch agent can add: once the job's own processes have all ended, mpirun
    # and the remote orted get NETNS_GRACE seconds (10) to finish. After a partition they cannot
    # reach each other and would wait for TCP's own timeouts (many minutes), and SIGTERM makes
    # mpirun crash in PMIx_Finalize: so they are killed, and the job ends with status 1.
    everything() { for k in $(seq 1 "$n"); do ip netns pids "$prefix$k" 2>/dev/null; done; }
    ranks() { for p in $(everything); do case $(cat "/proc/$p/comm" 2>/dev/null) in mpirun | orted | sh | ip | netns_link | "") ;; *) echo "$p" ;; esac; done; }
    kill_all() { for p in $(everything); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = netns_link ] || kill -KILL "$p" 2>/dev/null; done; }
    trap 'kill_all; rm -f "$hostfile"; exit 130' INT TERM
    seen=0 gone_at=
    while kill -0 "$mp" 2>/dev/null; do
        sleep 0.5
        if [ -n "$(ranks)" ]; then seen=1 gone_at=
        elif [ $seen -eq 1 ]; then
            [ -n "$gone_at" ] || gone_at=$SECONDS
            if [ $((SECONDS - gone_at)) -ge "${NETNS_GRACE:-10}" ] && kill -0 "$mp" 2>/dev/null; then
                echo "netns_hosts: every rank has ended but mpirun still runs after ${NETNS_GRACE:-10} s (a host is unreachable): killing mpirun and the daemons" >&2
                kill_all
                kill -KILL "$mp" 2>/dev/null
                wait "$mp"
                rm -f "$hostfile"
                exit 1
            fi
        fi
    done
    wait "$mp"
    rc=$?
    rm -f "$hostfile"
    exit $rc
    ;;
link)
    k=${3:?K} state=${4:?up or down}
    ip -n "${prefix}1" link set "${prefix}a$k" "$state"
    ! ip -n "${prefix}1" link show "${prefix}t$k" >/dev/null 2>&1 || ip -n "${prefix}1" link set "${prefix}t$k" "$state"
    if [ "$state" = up ]; then # a link going down took its routes with it
        dev="${prefix}a$k"
        ! ip -n "${prefix}1" link show "${prefix}t$k" >/dev/null 2>&1 || dev="${prefix}t$k"
        ip -n "${prefix}1" route replace "$(addr "$k")/32" dev "$dev"
    fi
    ;;
slow)
    k=${3:?K} delay=${4:?DELAY_MS} rate=${5:?RATE_MBIT} loss=${6:-0}
    "$0" fast "$prefix" "$k"
    link=${NETNS_LINK:-$(dirname "$0")/../build/netns_link}
    [ -x "$link" ] || { echo "netns_hosts: no netns_link program at $link (build it, or set NETNS_LINK)" >&2; exit 1; }
    dev="${prefix}t$k"
    "$link" "${prefix}1" "$prefix$k" "$dev" "$delay" "$rate" "$loss" > "$prefix.link$k.log" 2>&1 &
    echo $! > "$prefix.link$k.pid"
    for _ in $(seq 1 100); do
        ip -n "${prefix}1" link show "$dev" >/dev/null 2>&1 && ip -n "$prefix$k" link show "$dev" >/dev/null 2>&1 && break
        sleep 0.05
    done
    # a large MTU keeps the forwarder's packet rate, and so its CPU time, low
    for ns in "${prefix}1" "$prefix$k"; do ip -n "$ns" link set "$dev" mtu 64000 up; done
    ip -n "${prefix}1" route replace "$(addr "$k")/32" dev "$dev"
    ip -n "$prefix$k" route replace "$(addr 1)/32" dev "$dev"
    ;;
fast)
    k=${3:?K}
    if [ -f "$prefix.link$k.pid" ]; then
        kill "$(cat "$prefix.link$k.pid")" 2>/dev/null || true
        rm -f "$prefix.link$k.pid"
    fi
    ip -n "${prefix}1" route replace "$(addr "$k")/32" dev "${prefix}a$k" 2>/dev/null || true
    ip -n "$prefix$k" route replace "$(addr 1)/32" dev "${prefix}b$k" 2>/dev/null || true
    ;;
*)
    sed -n '3,27p' "$0"
    exit 2
    ;;
esac
