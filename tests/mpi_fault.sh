#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Faults in a 2-rank mpirun job: the job must end with a clear error within a bounded time, never
# hang, and the last checkpoint on disk must stay whole and resumable.
#  1. rank 1 killed (SIGKILL) between saves;
#  2. rank 0 killed while it writes a checkpoint: the checkpoint writer's test hook
#     (CGRAD_TEST_STOP_BEFORE_RENAME) stops it once the temp file is whole, before the rename; it is
#     killed there, and the previous checkpoint survives;
#  3. rank 1 stopped (SIGSTOP, a hang): rank 0 gives up after --dist-timeout and ends the job.
# Usage: mpi_fault.sh CGRAD MPIRUN
set -uo pipefail
bin=$1 mpirun=$2
run2=("$mpirun" --oversubscribe -n 2)
[ "$(id -u)" -eq 0 ] && run2+=(--allow-run-as-root)
dir=$(mktemp -d)
mp=
cleanup() { [ -n "$mp" ] && kill -KILL "$mp" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
cd "$dir"
for i in $(seq 1 400); do echo "line $i: the whale $((i * 7 % 13)) swims past ship $((i * 3 % 11)) at dawn."; done > text.txt
# d 256: a 6 MB model whose checkpoint takes a visible time to write
args=(--data text.txt --layers 2 --dim 256 --heads 4 --context 16 --batch 2 --steps 100000 --eval-every 0
      --samples 0 --threads 1 --log-every 1 --checkpoint f.ckpt)
fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }

# Every wait below is for a condition (a file, a log line, a process state), bounded only so that a
# broken build fails instead of hanging; none is a fixed sleep.
# rank_pid RANK: the pid of that rank among mpirun's children
rank_pid() {
    local p
    for p in $(pgrep -P "$mp"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
    done
}
# wait_for COND SECONDS: true once COND holds
wait_for() {
    local end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do eval "$1" && return 0; sleep 0.02; done
    return 1
}
# ended SECONDS: mpirun has exited within SECONDS; its status in $rc
ended() {
    local t0=$SECONDS
    if wait_for '! kill -0 $mp 2>/dev/null' "$1"; then wait "$mp"; rc=$?; took=$((SECONDS - t0)); mp=; return 0; fi
    return 1
}
# signal_rank SIG RANK SECONDS WHAT: sends SIG to that rank; the job must then end within SECONDS
# with a nonzero status (WHAT names the fault in the report). False if it still runs.
signal_rank() {
    kill -"$1" "$(rank_pid "$2")"
    if ended "$3"; then
        [ $rc -ne 0 ] && ok "$4: the job ended in ${took}s with status $rc" || bad "$4, but the job ended with status 0"
        return 0
    fi
    bad "the job still runs $3 s after: $4"
    return 1
}
# says FILE PATTERN SHOWN [LABEL]: FILE holds PATTERN; what matches SHOWN goes into the report
says() { grep -q "$2" "$1" && ok "${4:+$4: }$(grep -o "$3" "$1" | head -1)" || bad "no '$2' in $1: $(tail -c 600 "$1")"; }
saved_step() { "$bin" info f.ckpt 2>/dev/null | sed -n 's/^step *\([0-9]*\) of.*/\1/p'; }

# 1. rank 1 dies between saves
"${run2[@]}" "$bin" train "${args[@]}" --save-every 4 > one.out 2>&1 & mp=$!
if wait_for '[ -e f.ckpt ] && ! ls f.ckpt.tmp.* >/dev/null 2>&1 && grep -Eq " ([6-9]|[1-9][0-9]+)/100000" one.out' 120; then
    signal_rank KILL 1 30 "rank 1 killed" && says one.out "exited on signal 9" 'process rank 1.*signal 9' \
        "mpirun names the dead rank"
else bad "no checkpoint within 120 s: $(tail -c 400 one.out)"; fi
s1=$(saved_step)
[ -n "$s1" ] && [ $((s1 % 4)) -eq 0 ] && ok "checkpoint intact at step $s1" || bad "checkpoint unreadable after the kill"

# stopped PID: that process is stopped (state T in /proc/PID/stat)
stopped() { [ -n "$1" ] && [ "$(sed 's/^[^)]*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)" = T ]; }

# 2. rank 0 dies while it writes a checkpoint; the job resumes from the surviving one first. The
#    hook stops rank 0 between writing the temp file and renaming it: the kill lands there, always.
"${run2[@]}" -x CGRAD_TEST_STOP_BEFORE_RENAME=1 "$bin" train --resume f.ckpt --save-every 2 > two.out 2>&1 & mp=$!
if wait_for 'stopped "$(rank_pid 0)"' 120; then
    ls f.ckpt.tmp.* >/dev/null 2>&1 && ok "rank 0 stopped in a save, its temp file written ($(ls f.ckpt.tmp.* | head -1))" ||
        bad "rank 0 stopped, but no temp file"
    signal_rank KILL 0 30 "rank 0 killed during a save"
    s2=$(saved_step)
    [ -n "$s2" ] && [ "$s2" = "$s1" ] && ok "the previous checkpoint survived the killed save (step $s2, resumed from $s1)" \
        || bad "checkpoint unreadable after a killed save"
else bad "rank 0 never stopped in a save: $(tail -c 400 two.out)"; fi
rm -f f.ckpt.tmp.*

# 3. rank 1 hangs: rank 0's bounded wait ends the job
"${run2[@]}" "$bin" train --resume f.ckpt --dist-timeout 4 > three.out 2>&1 & mp=$!
s3=$(saved_step)
if wait_for 'grep -q "resuming at step" three.out && grep -q " $((s3 + 1))/100000" three.out && [ -n "$(rank_pid 1)" ]' 60; then
    signal_rank STOP 1 40 "rank 1 stopped (--dist-timeout 4)" &&
        says three.out "no answer from the other ranks for 4 s" 'rank 0: no answer.*hangs'
else bad "the resumed job did not start: $(tail -c 400 three.out)"; fi
[ -n "$(saved_step)" ] && ok "checkpoint still loads" || bad "checkpoint unreadable at the end"
exit $fail
