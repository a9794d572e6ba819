#!/usr/bin/env bash
# The GPU acceptance runs: the test suite (every file, on this box's GPU), the release
# matrix with and without the oracle, the slot-mapping op's release matrix, the release
# bisect, the default run, the property search on releases, the selftest, the merge's
# release matrices (its group merges and merge_attn_states), the sparse read side's
# release matrix, the paged K/V cache write's release matrix, the decode chain's token streams through every release,
# compute-sanitizer (tests, slowdown, and every shipped scenario under each tool:
# sanitize-all), and the ahead-of-time fit check under this box's Triton (fit). Releases
# come from $DCPCHECK_CACHE (carry it: the GPU box has no network).
# Usage: DCPCHECK_CACHE=$PWD/.dcpcheck-cache OUT=out bash benchmarks/gpu_releases.sh [JOBS]
#
# The jobs run side by side. The matrices judge each release in one process of their own
# (benchmarks/op_matrix.py), at most $MATRIX_SLOTS such processes at once across all of
# them; with the test job's $TEST_WORKERS, the selftest and the bisect, that is about one
# process a core on a 16-core box, each on one CPU thread (OMP_NUM_THREADS: torch's
# intra-op threads, 16 a process by default, would oversubscribe the cores many times).
# Each job prints its wall time; the matrices print each row's wall and CPU time to
# OUT/*_rows.log, and OUT/gpu_memory.log samples the GPU's memory
# per process every $MONITOR_S seconds.
set -u
OUT=${OUT:-out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the scripts import dcpcheck from the checkout
export MATRIX_SLOTS=${MATRIX_SLOTS:-8}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Python writes bytecode, as after a pip install: on an image that sets
# PYTHONDONTWRITEBYTECODE and ships torch without it (the lent GPU machines'), every process
# would compile torch's source as it imports it, about 2 s each (BENCHMARKS.md).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/dcpcheck-pycache}
TEST_WORKERS=${TEST_WORKERS:-6}
MONITOR_S=${MONITOR_S:-5}
mkdir -p "$OUT"
JOBS=${1:-"tests matrix bisect"}
timed() {  # run "$@", then print its wall time and exit code
  local start=$SECONDS; "$@"; local rc=$?
  echo "$((SECONDS - start)) s wall, exit $rc"
}
monitor() {  # every MONITOR_S s: seconds since start, the GPU's memory, then each process's
  local start=$SECONDS
  while sleep "$MONITOR_S"; do
    echo "t=$((SECONDS - start)) s $(nvidia-smi --query-gpu=memory.used,utilization.gpu \
      --format=csv,noheader) load $(cut -d' ' -f1 /proc/loadavg)"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader |
      while IFS=', ' read -r pid used unit; do
        echo "  $used $unit $(ps -o args= -p "$pid" | cut -c1-150)"
      done
  done
}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
monitor > "$OUT/gpu_memory.log" 2>&1 &
MONITOR=$!
for job in $JOBS; do
  case $job in
    tests)  # every test file but the two the sanitizer job runs, one test at a time
      ( timed python3 -m pytest -q -p no:cacheprovider -n "$TEST_WORKERS" --durations=30 -rs tests \
          --ignore=tests/test_sanitizer.py --ignore=tests/test_faults.py \
          > "$OUT/tests.log" 2>&1 ) & ;;
    sanitizer)
      ( python3 -m pytest -q -p no:cacheprovider -rs tests/test_sanitizer.py tests/test_faults.py \
          > "$OUT/sanitizer_tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/sanitizer_tests.log"
        timed python3 benchmarks/sanitizer_slowdown.py > "$OUT/sanitizer_slowdown.md" 2>&1 ) & ;;
    sanitize-all)  # the default kernel under every tool, on every shipped scenario
      for tool in memcheck initcheck racecheck synccheck; do
        ( timed python3 -m dcpcheck run --no-tokens --dcp 4 --sanitize $tool \
            --json "$OUT/sanitize_$tool.json" > "$OUT/sanitize_$tool.log" 2>&1 ) &
      done ;;
    matrix)  # oracle on and off, the token streams with the oracle on only
      ( timed python3 benchmarks/release_matrix.py --jobs 9 --out "$OUT/releases" \
          > "$OUT/release_matrix.md" 2> "$OUT/release_rows.log" ) & ;;
    bisect)
      ( timed python3 -m dcpcheck bisect \
          --releases 0.28.0,0.29.0,0.30.0,0.31.0,0.32.0,0.33.0 --find first-fixed \
          --scenario decode-single-dcp4 --dcp 4 > "$OUT/bisect.log" 2>&1
        for k in default regress/pre-54908; do
          timed python3 -m dcpcheck run --dcp 4 --kernel $k > "$OUT/run_${k//\//-}.log" 2>&1
        done ) & ;;
    slot-mapping)  # vLLM's slot-mapping kernel in every release that has it
      ( timed python3 benchmarks/slot_mapping_matrix.py --jobs 37 --out "$OUT/slot-mapping" \
          > "$OUT/slot_mapping_matrix.md" 2> "$OUT/slot_mapping_rows.log" ) & ;;
    lse-combine)  # vLLM's merges in every release, and the bf16-LSE measurement
      ( timed python3 benchmarks/lse_combine_matrix.py --jobs 37 --out "$OUT/lse-combine" \
          > "$OUT/lse_combine_matrix.md" 2> "$OUT/lse_combine_rows.log" ) &
      ( timed python3 benchmarks/lse_precision.py --shift 20 > "$OUT/lse_precision.md" 2>&1 ) & ;;
    sparse-topk-remap)  # vLLM's converters in every release, as their backends call them
      ( timed python3 benchmarks/sparse_topk_remap_matrix.py --jobs 37 --out "$OUT/sparse-topk-remap" \
          > "$OUT/sparse_topk_remap_matrix.md" 2> "$OUT/sparse_topk_remap_rows.log" ) & ;;
    reshape-and-cache-flash)  # vLLM's paged K/V cache write in every release that has it
      ( timed python3 benchmarks/reshape_and_cache_flash_matrix.py --jobs 37 \
          --out "$OUT/reshape-and-cache-flash" > "$OUT/reshape_and_cache_flash_matrix.md" \
          2> "$OUT/reshape_and_cache_flash_rows.log" ) & ;;
    chain)  # token streams through every release's slot mappings, attention and merge
      ( timed python3 benchmarks/chain_matrix.py --jobs 37 --out "$OUT/chain" \
          > "$OUT/chain_matrix.md" 2> "$OUT/chain_rows.log" ) & ;;
    property)
      for v in 0.30.0 0.31.0 0.32.0 0.33.0 0.34.0; do
        ( timed python3 -m dcpcheck run --kernel vllm==$v --dcp 1 --property-only \
            --examples 300 --profile thorough --stats --home "$OUT/home-$v" \
            > "$OUT/property_$v.log" 2>&1 ) &
      done ;;
    fit)  # every launch of the manifest compiled by this box's Triton, against the budget
      ( timed python3 -m dcpcheck.gpu_fit check 4 > "$OUT/gpu_fit.log" 2>&1 ) & ;;
    selftest)
      ( timed python3 -m dcpcheck selftest --profile thorough > "$OUT/selftest.log" 2>&1 ) & ;;
  esac
done
for child in $(jobs -p); do [ "$child" = "$MONITOR" ] || wait "$child"; done
kill "$MONITOR"
tail -n 3 "$OUT"/*.log; tail -n 1 "$OUT"/*.md
