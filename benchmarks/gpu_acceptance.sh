#!/usr/bin/env bash
# The GPU acceptance commands and figures of the issues, on a CUDA box with torch and
# triton (no network), in two phases that each fit a 10-minute slot. Logs go to $OUT.
#   bash benchmarks/gpu_acceptance.sh checks       # tests at real shapes, run, hash
#   bash benchmarks/gpu_acceptance.sh figures      # property, selftest, benchmarks
set -u -o pipefail
out=${OUT:-gpu-logs}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 DCPCHECK_HOME=$(mktemp -d)
dcp() { python3 -m dcpcheck "$@"; }
step() { echo; echo "=== $*"; }
timed() {
  local start=$(date +%s%N); "$@"; local rc=$?
  echo "[exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms: $*]"
}

checks() {
  step "environment"
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  step "tests on the GPU: real shapes, 65,536 tokens, golden vectors, full-width model, crash isolation, NCCL rank"
  timed python3 -m pytest -q -p no:cacheprovider tests/test_kernel.py tests/test_golden_vectors_kernel.py \
    tests/test_golden_vectors_reference.py tests/test_token_streams.py tests/test_checks.py tests/test_run_cli.py 2>&1 | tail -6
  timed python3 -m pytest -q -p no:cacheprovider tests/test_faults.py tests/test_distributed.py tests/test_mutants.py \
    -k "illegal_memory or nccl_rank or address_32bit" 2>&1 | tail -4
  step "dcpcheck run --dcp 4 over the shipped scenarios (cold, then warm Triton cache)"
  export TRITON_CACHE_DIR=$(mktemp -d)
  timed dcp run --dcp 4 --json "$out/run-default.json" 2>&1 | tail -3
  timed dcp run --dcp 4 2>&1 | tail -1
  for k in regress/pre-54908 regress/pre-50005; do
    timed dcp run --dcp 4 --kernel "$k" --json "$out/run-${k#regress/}.json" > "$out/run-${k#regress/}.txt" 2>&1
    grep -E "^FAIL" "$out/run-${k#regress/}.txt" | head -3; tail -1 "$out/run-${k#regress/}.txt"
    timed dcp run --dcp 1 --kernel "$k" 2>&1 | tail -1
  done
  step "token streams at real MLA dims"
  for layout in auto fp8 fp8_ds_mla; do timed dcp hash --dcp 1,2,4,8 --layout $layout 2>&1 | tail -1; done
  for k in regress/pre-54908 regress/pre-50005; do timed dcp hash --dcp 1,4 --kernel "$k" 2>&1 | tail -1; done
}

figures() {
  step "property search: regressions shrink and replay; default kernel throughput"
  for k in regress/pre-54908 regress/pre-50005; do
    timed dcp run --dcp 4 --kernel "$k" --property-only --examples 100 --stats 2>&1 | grep -E "property|saved|stats"
  done
  for f in "$DCPCHECK_HOME"/failures/shrunk-*.toml; do
    k=regress/$(basename "$f" | grep -o 'pre-[0-9]*')
    dcp repro "$f" --kernel "$k" > /dev/null 2>&1; a=$?; dcp repro "$f" > /dev/null 2>&1; b=$?
    echo "repro $(basename "$f"): $k exit $a, default exit $b"
  done
  timed dcp run --dcp 4 --property-only --examples "${EXAMPLES:-300}" --profile thorough --stats 2>&1 | grep -E "^property|stats"
  step "selftest"
  timed dcp selftest --profile thorough --mutant mutant/address-32bit 2>&1 | tail -4
  timed dcp selftest --profile ci 2>&1 | tee "$out/selftest.txt" | tail -3
  step "benchmarks"
  timed python3 benchmarks/harness_overhead.py 2>&1 | tee "$out/overhead.txt"
  timed python3 benchmarks/kernel_bandwidth.py --quick 2>&1 | tee "$out/bandwidth.txt"
  timed python3 benchmarks/gate_wall_time.py --only bisect 2>&1 | tee "$out/bisect.txt"
}

"${1:-checks}"
