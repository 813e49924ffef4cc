#!/usr/bin/env bash
# make bench: every benchmark that runs on this machine, one after the other, JSON into
# bench-results/ (override with KVTIER_BENCH_OUT). GPU figures come from the device machine (see
# README); here the engine runs on lavapipe, so engine and e2e numbers describe the CPU.
set -euo pipefail
build=${1:-build}
out=${KVTIER_BENCH_OUT:-bench-results}
mkdir -p "$out"
export KVTIER_BENCH_OUT=$out
run() { echo; echo "### $*"; "$@"; }
run "$build/bench/serialize_bench"
run "$build/bench/cache_bench"
run "$build/bench/ssd_bench"
run "$build/bench/server_bench"
run "$build/bench/kv_events_bench" --reps 3 --seconds 5 --clients 4 --json "$out/kv_events_bench.json"
run "$build/bench/engine_bench" --dtypes BF16 --reps 3 --max-kv-bytes 268435456
run "$build/bench/e2e_bench" --prompts 2048 --reps 3
# Debian's interpreter: torch and numpy are its packages (a pyenv python3 first on PATH has neither).
py=/usr/bin/python3; [[ -x $py ]] || py=python3
PYTHONPATH="$build/python" run "$py" bench/python_embed_bench.py --build "$build"
echo; echo "results in $out/"
