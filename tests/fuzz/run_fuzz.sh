#!/usr/bin/env bash
# Build the fuzz targets (`make fuzz`, clang + libFuzzer) and run each one in turn over a scratch
# copy of its seed corpus (docs/fuzzing.md).
#   usage: tests/fuzz/run_fuzz.sh [SECONDS] [TARGET...]   each target for SECONDS (default 60)
#          tests/fuzz/run_fuzz.sh --runs N [TARGET...]     each target for N executions
#   TARGET: gguf http_body tokenizer chat_template proto arena (default: all six, so a plain run
#   takes 6 x SECONDS plus the build)
# Prints one line per target (executions, executions per second, result) and exits non-zero when
# any target found a crash, leak or timeout; the reproducer is written to
# build-fuzz/artifacts/<target>/ and the fuzzer's whole output to build-fuzz/logs/<target>.log.
# Inputs the fuzzer discovers stay in build-fuzz/corpus-work/<target>/ (not in git).
# OROCHI_FUZZ_KNOWN_BUGS=1 stops stepping around the open bugs docs/fuzzing.md lists.
# FUZZ_TIMEOUT=S (default 10): seconds one input may run before it counts as a hang. libFuzzer
# measures wall-clock time, so a run that is paused (SIGSTOP, to keep a benchmark's cores quiet)
# for longer than S reports a false timeout: raise it for such runs.
set -euo pipefail

all_targets=(gguf http_body tokenizer chat_template proto arena grammar)
mode=time
amount=60
if [ "${1:-}" = "--runs" ]; then
    mode=runs
    amount="${2:-}"
    shift 2 || { echo "run_fuzz.sh: --runs needs a number" >&2; exit 2; }
elif [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
    amount="$1"
    shift
fi
case "$amount" in
    '' | *[!0-9]*)
        echo "run_fuzz.sh: the amount must be a whole number, got '$amount'" >&2
        exit 2
        ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
    case " ${all_targets[*]} " in
        *" $t "*) ;;
        *) echo "run_fuzz.sh: no target '$t' (have: ${all_targets[*]})" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
make fuzz JOBS="${JOBS:-2}"

# UBSan aborts by itself in this build (-fno-sanitize-recover); ask it for a stack trace
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

failed=()
summary=()
for t in "${targets[@]}"; do
    bin="$root/build-fuzz/bin/fuzz_$t"
    work="$root/build-fuzz/corpus-work/$t"
    artifacts="$root/build-fuzz/artifacts/$t"
    log="$root/build-fuzz/logs/$t.log"
    rm -rf "$work"
    mkdir -p "$work" "$artifacts" "$(dirname "$log")"
    if [ "$t" = gguf ]; then
        seeds=("$root"/tests/fuzz/corpus/*.gguf)
    else
        seeds=("$root"/tests/fuzz/corpus/"$t"/*)
    fi
    if [ -e "${seeds[0]}" ]; then
        cp "${seeds[@]}" "$work/"
    else
        python3 "$root/tests/fuzz/make_corpus.py" "$root/build-fuzz/corpus-seeds" >/dev/null
        if [ "$t" = gguf ]; then
            cp "$root"/build-fuzz/corpus-seeds/*.gguf "$work/"
        else
            cp "$root"/build-fuzz/corpus-seeds/"$t"/* "$work/"
        fi
    fi
    opts=(-max_len=4096 -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$artifacts/")
    if [ "$mode" = time ]; then
        opts+=(-max_total_time="$amount")
    else
        opts+=(-runs="$amount")
    fi
    case "$t" in
        http_body) opts+=(-dict="$root/tests/fuzz/http_body.dict") ;;
        grammar) opts+=(-dict="$root/tests/fuzz/grammar.dict") ;;
        tokenizer | chat_template) opts+=(-dict="$root/tests/fuzz/tokenizer.dict") ;;
        proto) opts+=(-close_fd_mask=2) ;; # the coordinator logs a line per message
    esac
    if [ "$mode" = time ]; then
        echo "run_fuzz.sh: fuzzing $t for ${amount}s (corpus $work)"
    else
        echo "run_fuzz.sh: fuzzing $t for $amount executions (corpus $work)"
    fi
    start=$(date +%s%N)
    rc=0
    "$bin" "$work" "${opts[@]}" >"$log" 2>&1 || rc=$?
    ns=$(($(date +%s%N) - start))
    took=$((ns / 1000000000))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(awk -v n="${execs:-0}" -v ns="$ns" 'BEGIN { printf "%d", (ns > 0 ? n * 1e9 / ns : 0) }')
    if [ "$rc" -eq 0 ]; then
        result="ok"
    else
        result="FAILED (exit $rc)"
        failed+=("$t")
        echo "---- fuzz_$t: the end of $log" >&2
        tail -n 60 "$log" >&2
        echo "---- reproducer(s) in $artifacts/:" >&2
        ls -1 "$artifacts" >&2 || true
    fi
    line=$(printf '%-14s %12s execs %8s exec/s %6ss  %s' \
        "$t" "${execs:-?}" "${rate:-?}" "$took" "$result")
    echo "run_fuzz.sh: $line"
    summary+=("$line")
done

echo "run_fuzz.sh: summary"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_fuzz.sh: the fuzzer failed on: ${failed[*]} (reproducers in build-fuzz/artifacts/)" >&2
    exit 1
fi
echo "run_fuzz.sh: no crash"
