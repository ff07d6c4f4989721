#!/bin/bash
# SPDX-License-Identifier: MIT
# Runs the libFuzzer fuzzers of a -Dfuzz=true build: for each, first every seed once (the corpus
# replay: a seed that crashes fails at once), then SECONDS of fuzzing from the seeds plus the corpus
# kept in BUILDDIR/fuzz-corpus/NAME, which grows across runs. Prints one line per fuzzer with its exec
# count; a crash leaves its input in BUILDDIR/fuzz-artifacts/ and fails the run.
#   tests/fuzz/run-fuzzers.sh BUILDDIR SECONDS [NAME...]     (NAME: fuzz-config, fuzz-cdi, …; default all)
set -u
[ $# -ge 2 ] || { echo "usage: $0 BUILDDIR SECONDS [NAME...]" >&2; exit 2; }
build=$(cd "$1" && pwd) || exit 2
seconds=$2
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)

# Seed corpora: the fixtures the unit tests use for the same code.
seeds() {
        case $1 in
        fuzz-config) echo "$src/conf.d $src/conf.d/examples $src/tests/fuzz/seeds/config" ;;
        fuzz-mig-config) echo "$src/tests/fixtures/mig-parted $src/tests/fixtures/mig-bench $src/tests/fuzz/seeds/mig-config" ;;
        fuzz-cdi) echo "$src/tests/fixtures/cdi/golden $src/tests/fixtures/cdi/loader-rejects $src/tests/fixtures/cdi/testdata/good $src/tests/fixtures/cdi/testdata/bad" ;;
        fuzz-labels) echo "$src/tests/unit/golden/labels" ;;
        fuzz-probe) echo "$src/tests/fixtures/nodes $src/tests/fuzz/seeds/probe" ;;
        *) return 1 ;;
        esac
}

[ $# -gt 0 ] || set -- fuzz-config fuzz-mig-config fuzz-cdi fuzz-labels fuzz-probe
failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for name in "$@"; do
        exe="$build/tests/fuzz/$name"
        dirs=$(seeds "$name") || { echo "$name: unknown fuzzer" >&2; failed=1; continue; }
        [ -x "$exe" ] || { echo "$name: $exe not built (meson setup with -Dfuzz=true, CC=clang)" >&2; failed=1; continue; }
        corpus="$build/fuzz-corpus/$name"
        artifacts="$build/fuzz-artifacts"
        mkdir -p "$corpus" "$artifacts"
        existing=()
        for d in $dirs; do [ -d "$d" ] && existing+=("$d"); done
        log="$build/fuzz-artifacts/$name.log"

        # 1. Replay: every seed and every corpus entry once.
        if ! "$exe" -runs=0 -timeout=10 -artifact_prefix="$artifacts/$name-" "$corpus" "${existing[@]}" >"$log" 2>&1; then
                echo "$name: FAILED replaying the corpus (see $log)"
                tail -n 40 "$log"
                failed=1
                continue
        fi
        # 2. Fuzz for the budget; new inputs go to the first directory, the kept corpus.
        if ! "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
                -artifact_prefix="$artifacts/$name-" "$corpus" "${existing[@]}" >"$log" 2>&1; then
                echo "$name: FAILED while fuzzing (see $log and $artifacts/)"
                tail -n 60 "$log"
                failed=1
                continue
        fi
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
        units=$(ls "$corpus" | wc -l)
        echo "$name: ${execs:-?} execs in ${seconds} s (${rate:-?}/s), corpus $units inputs, no crash"
done
exit $failed
