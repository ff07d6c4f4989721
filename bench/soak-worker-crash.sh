#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Soak (not in the suite; root): runs the scenario in which the agent once died -- a when-idle driver
# reload while the health event worker is down between injected crashes
# (test_reload_while_health_worker_restarts) -- and its strace-forced variant
# (test_event_worker_crash_while_the_agent_writes, every 10th run) N times, each with a random
# MALLOC_PERTURB_, and counts the runs that failed and those in which the agent died. Core dumps are
# on (ulimit -c unlimited); a failed run's log is kept in OUT.
#   bench/soak-worker-crash.sh [-n 500] [-b build] [-o /tmp/gna-soak]
set -u
n=500 build=build out=/tmp/gna-soak
while getopts n:b:o: opt; do
        case $opt in
        n) n=$OPTARG ;;
        b) build=$OPTARG ;;
        o) out=$OPTARG ;;
        *) echo "usage: $0 [-n RUNS] [-b BUILDDIR] [-o OUTDIR]" >&2; exit 2 ;;
        esac
done
cd "$(dirname "$0")/.."
mkdir -p "$out"
ulimit -c unlimited
failed=0 died=0 start=$(date +%s)
for i in $(seq 1 "$n"); do
        t=test_reload_while_health_worker_restarts
        [ $((i % 10)) -eq 0 ] && t=test_event_worker_crash_while_the_agent_writes
        if ! MALLOC_PERTURB_=$((RANDOM % 255 + 1)) meson test -C "$build" --no-rebuild --logbase soak \
                integration-driver --test-args "$t" >/dev/null 2>&1; then
                failed=$((failed + 1))
                cp "$build/meson-logs/soak.txt" "$out/run-$i.txt"
                grep -q "agent died" "$out/run-$i.txt" && died=$((died + 1))
                echo "run $i ($t): FAILED, log in $out/run-$i.txt"
        fi
done
echo "$n runs in $(( $(date +%s) - start )) s: $failed failed, $died with the agent dead"
[ "$failed" -eq 0 ]
