#!/usr/bin/env bash
# Runs a libFuzzer target for a fixed time over a fresh copy of its seed corpus. A crash, a
# sanitizer report or a failed round trip fails the test (libFuzzer exits non-zero).
#   run_fuzz.sh FUZZER SEED_WRITER SECONDS [SEED_WRITER_ARGS...]
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
"$seeds" "$@" "$work/corpus"
cd "$work"
"$fuzzer" -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 corpus 2>&1 | tail -n 20
