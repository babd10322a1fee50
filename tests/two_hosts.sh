#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `cgrad train` across two simulated hosts (network namespaces joined by a veth pair, TCP only,
# mpirun reaching the second host through dist/netns_hosts.sh's launch agent):
#  1. 2 hosts x batch 4 equal 1 process x --grad-accum 2 x batch 4, bit for bit;
#  2. a 2-host run resumed from its last checkpoint continues exactly;
#  3. the remote rank killed: the whole job ends with a nonzero status within a bounded time, and
#     no process is left in either host;
#  4. the link cut for longer than --dist-timeout: the ranks end with the documented message, and
#     the whole job (mpirun and the remote daemon too, through the launcher's watchdog) with
#     status 1, leaving no process;
#  5. host 2 dead (all its processes killed): the job ends, no process left;
#  6. a 2 s outage that heals: the job carries on and finishes;
#  7. through dist/netns_link.c's user-space link with delay, rate and loss: still bit for bit.
# Needs root, network namespaces and mpirun: exits 77 (skipped) without them.
# Usage: two_hosts.sh CGRAD MPIRUN
set -uo pipefail
bin=$1 mpirun=$2
here=$(cd "$(dirname "$0")" && pwd)
hosts="$here/../dist/netns_hosts.sh"
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root for network namespaces"; exit 77; }
command -v ip >/dev/null && command -v "$mpirun" >/dev/null || { echo "skip: needs iproute2 and mpirun"; exit 77; }
prefix="cg$$"
ip netns add "${prefix}probe" 2>/dev/null || { echo "skip: cannot make network namespaces here"; exit 77; }
ip netns del "${prefix}probe"
dir=$(mktemp -d)
mp=
cleanup() {
    [ -n "$mp" ] && kill -KILL "$mp" 2>/dev/null
    for ns in "${prefix}1" "${prefix}2"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    "$hosts" down "$prefix" 2 >/dev/null 2>&1
    rm -rf "$dir"
}
trap cleanup EXIT
"$hosts" up "$prefix" 2 || { echo "FAIL: could not set up the two hosts"; exit 1; }
cd "$dir"
for i in $(seq 1 400); do echo "line $i: the whale $((i * 7 % 13)) swims past ship $((i * 3 % 11)) at dawn."; done > text.txt
args=(--data "$dir/text.txt" --layers 2 --dim 32 --heads 2 --context 16 --batch 4 --eval-every 2 --eval-batches 3
      --samples 0 --dropout 0.1 --threads 1 --log-every 1 --decay-steps 8 --warmup 2)
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
digest() { "$bin" info "$1" | grep '^digest'; }
two() { NETNS_GRACE=5 "$hosts" mpirun "$prefix" 2 -- "$bin" train "$@"; }
wait_for() {
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do eval "$1" && return 0; sleep 0.05; done
    return 1
}
left() { echo "$(ip netns pids "${prefix}1" 2>/dev/null) $(ip netns pids "${prefix}2" 2>/dev/null)" | xargs; }
# the job logging to $1 reached step 5 of $2 within 120 s (else says so)
started() { wait_for "grep -Eq ' ([5-9]|[1-9][0-9]+)/$2' $1" 120 || { bad "no steps within 120 s: $(tail -c 1500 "$1")"; return 1; }; }
# the job ($mp) ended within $1 s: its status in rc
ended_within() { wait_for '! kill -0 $mp 2>/dev/null' "$1" || return 1; wait "$mp"; rc=$?; mp=; }
none_left() { wait_for '[ -z "$(left)" ]' 10 && ok "$1: no process left on either host" || bad "$1: processes left: $(left)"; }

# 1. exact against one process
"$bin" train "${args[@]}" --steps 6 --grad-accum 2 --save-every 0 --checkpoint "$dir/one.ckpt" > one.out 2>&1 || { cat one.out; exit 1; }
two "${args[@]}" --steps 6 --save-every 0 --checkpoint "$dir/two.ckpt" > two.out 2>&1 || { cat two.out; exit 1; }
[ -n "$(digest one.ckpt)" ] && [ "$(digest one.ckpt)" = "$(digest two.ckpt)" ] &&
    ok "2 hosts over TCP x batch 4 = 1 process x grad-accum 2, bit for bit ($(digest two.ckpt))" ||
    bad "2 hosts differ from 1 process: $(digest one.ckpt) / $(digest two.ckpt)"
grep -q "2 ranks (MPI)" two.out && ok "the job ran on 2 ranks: $(grep -o 'all-reduce:.*a step' two.out | head -1)" ||
    bad "no 2-rank report: $(tail -c 400 two.out)"

# 2. resume across hosts from the last checkpoint
two "${args[@]}" --steps 4 --save-every 2 --checkpoint "$dir/r.ckpt" > r1.out 2>&1 || cat r1.out
two --resume "$dir/r.ckpt" --steps 6 > r2.out 2>&1 || cat r2.out
[ "$(digest r.ckpt)" = "$(digest two.ckpt)" ] && ok "a 2-host run resumed at step 4 of 6 = 6 steps straight" ||
    bad "resume differs: $(digest r.ckpt) / $(digest two.ckpt)"

# 3. the remote rank dies
long=("${args[@]}" --steps 100000 --save-every 0 --checkpoint "$dir/k.ckpt")
two "${long[@]}" > kill.out 2>&1 & mp=$!
if started kill.out 100000; then
    # the rank on host 2: the cgrad process among that namespace's (its daemon, orted, is the other)
    remote_rank() { for p in $(ip netns pids "${prefix}2"); do [ "$(readlink "/proc/$p/exe")" = "$(readlink -f "$bin")" ] && echo "$p"; done | head -1; }
    wait_for '[ -n "$(remote_rank)" ]' 10
    remote=$(remote_rank)
    [ -n "$remote" ] || bad "no cgrad process on host 2: $(for p in $(ip netns pids "${prefix}2"); do cat "/proc/$p/comm"; done | xargs)"
    t0=$SECONDS
    kill -KILL "$remote"
    if ended_within 30; then
        [ $rc -ne 0 ] && ok "remote rank killed: the job ended in $((SECONDS - t0)) s with status $rc" ||
            bad "remote rank killed, but the job ended with status 0"
        none_left "remote rank killed"
    else bad "the job still runs 30 s after the remote rank was killed"; fi
fi

# 4. a partition longer than --dist-timeout: the ranks give up, and the launcher's watchdog
# (netns_hosts.sh, NETNS_GRACE) ends mpirun and the remote daemon, which cannot reach each other
two "${args[@]}" --steps 100000 --save-every 0 --dist-timeout 4 --checkpoint "$dir/p.ckpt" > part.out 2>&1 & mp=$!
if started part.out 100000; then
    "$hosts" link "$prefix" 2 down
    t0=$SECONDS
    if wait_for 'grep -q "no answer from the other ranks" part.out' 30; then
        ok "partition: the ranks gave up after $((SECONDS - t0)) s: $(grep -m1 -o 'no answer from the other ranks.*' part.out | cut -c1-120)"
    else bad "partition: no rank reported the timeout within 30 s: $(tail -c 400 part.out)"; fi
    if ended_within 40; then
        [ $rc -eq 1 ] && ok "partition: the whole job ended in $((SECONDS - t0)) s with status 1" ||
            bad "partition: the job ended with status $rc, not 1: $(tail -c 300 part.out)"
        none_left "partition"
    else bad "partition: the job still runs $((SECONDS - t0)) s into the partition"; fi
fi
"$hosts" link "$prefix" 2 up
wait_for 'ip -n "${prefix}2" link show "${prefix}b2" | grep -q LOWER_UP' 10 && sleep 1

# 5. a dead host: every process of host 2 killed at once (its daemon and its rank)
two "${long[@]}" > host.out 2>&1 & mp=$!
if started host.out 100000; then
    t0=$SECONDS
    for p in $(ip netns pids "${prefix}2"); do kill -KILL "$p" 2>/dev/null; done
    if ended_within 30; then
        [ $rc -ne 0 ] && ok "dead host: the job ended in $((SECONDS - t0)) s with status $rc" ||
            bad "dead host: the job ended with status 0"
        none_left "dead host"
    else bad "dead host: the job still runs 30 s later"; fi
fi

# 6. a short outage (2 s) heals: the job goes on and finishes
two "${args[@]}" --steps 40 --save-every 0 --checkpoint "$dir/o.ckpt" > out.out 2>&1 & mp=$!
if started out.out 40; then
    "$hosts" link "$prefix" 2 down
    sleep 2
    "$hosts" link "$prefix" 2 up
    if ended_within 60; then
        [ $rc -eq 0 ] && grep -q "final step=40" out.out && ok "a 2 s outage healed: the job finished its 40 steps" ||
            bad "a 2 s outage: status $rc: $(tail -c 300 out.out)"
    else bad "a 2 s outage: the job still runs 60 s later"; fi
fi
# 7. through the user-space link (netns_link: 1 ms, 200 Mbit/s, 2% of the packets lost): still exact
link="$(dirname "$bin")/netns_link"
if [ -x "$link" ]; then
    NETNS_LINK=$link "$hosts" slow "$prefix" 2 1 200 0.02
    two "${args[@]}" --steps 6 --save-every 0 --checkpoint "$dir/s.ckpt" > slow.out 2>&1 || cat slow.out
    [ "$(digest s.ckpt)" = "$(digest one.ckpt)" ] && ok "through a 1 ms, 200 Mbit/s link losing 2% of the packets: still bit for bit" ||
        bad "through the user-space link: $(digest s.ckpt) / $(digest one.ckpt): $(tail -c 300 slow.out)"
    "$hosts" fast "$prefix" 2
else echo "note: no netns_link next to $bin: the user-space link is not tested"; fi
exit $fail
