#!/usr/bin/env bash
# Build the GGUF fuzz target (`make fuzz`, clang + libFuzzer) and run it for N seconds
# (default 60) over a scratch copy of the seed corpus tests/fuzz/corpus/.
#   usage: tests/fuzz/run_fuzz.sh [SECONDS]
# Exits non-zero when the fuzzer finds a crash, leak or timeout; the reproducer is written to
# build-fuzz/artifacts/. New inputs it discovers stay in build-fuzz/corpus-work/ (not in git).
set -euo pipefail

seconds="${1:-60}"
case "$seconds" in
    '' | *[!0-9]*) echo "run_fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

make fuzz JOBS="${JOBS:-2}"

bin="$root/build-fuzz/bin/fuzz_gguf"
work="$root/build-fuzz/corpus-work"
artifacts="$root/build-fuzz/artifacts"
rm -rf "$work"
mkdir -p "$work" "$artifacts"
if compgen -G "$root/tests/fuzz/corpus/*.gguf" >/dev/null; then
    cp "$root"/tests/fuzz/corpus/*.gguf "$work/"
else
    python3 "$root/tests/fuzz/make_corpus.py" "$work"
fi

echo "run_fuzz.sh: fuzzing gguf for ${seconds}s (corpus $work)"
if ! "$bin" "$work" \
    -max_total_time="$seconds" \
    -max_len=4096 \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/"; then
    echo "run_fuzz.sh: the fuzzer failed; reproducer(s) in $artifacts/" >&2
    exit 1
fi
echo "run_fuzz.sh: ${seconds}s, no crash"
