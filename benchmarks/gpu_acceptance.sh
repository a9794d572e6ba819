#!/usr/bin/env bash
# The GPU acceptance commands and figures of the issues, on a CUDA box with torch and
# triton (no network), in two phases that each fit a 10-minute slot. Logs go to $OUT.
#   bash benchmarks/gpu_acceptance.sh verify    # five jobs side by side (16 cores, one GPU):
#                                               # tests at real shapes, fault tests + hash,
#                                               # run commands, the 2,000-example property
#                                               # search, the thorough selftest
#   bash benchmarks/gpu_acceptance.sh figures   # timings, on an otherwise idle machine
# JOBS="tests commands" picks verify's jobs.
set -u -o pipefail
out=${OUT:-gpu-logs}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export DCPCHECK_HOME=${DCPCHECK_HOME:-$(mktemp -d)}
dcp() { timeout -k 10 "${STEP_LIMIT:-590}" python3 -m dcpcheck "$@"; }
step() { echo; echo "=== $*"; }
timed() {
  local start=$(date +%s%N); "$@"; local rc=$?
  echo "[exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms: $*]"
}

tests() {
  step "environment"
  python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'
  step "tests on the GPU: real shapes, 65,536 tokens, golden vectors, full-width model, run CLI"
  timed python3 -m pytest -q -p no:cacheprovider tests/test_kernel.py tests/test_golden_vectors_kernel.py \
    tests/test_golden_vectors_reference.py tests/test_token_streams.py tests/test_checks.py tests/test_run_cli.py \
    tests/test_seeded.py 2>&1 | tail -6
}

faults() {
  step "tests on the GPU: crash isolation, NCCL rank, the address-overflow mutant"
  timed python3 -m pytest -q -p no:cacheprovider tests/test_faults.py tests/test_distributed.py tests/test_mutants.py \
    -k "illegal_memory or nccl_rank or address_32bit" 2>&1 | tail -4
  step "token streams at real MLA dims"
  for layout in auto fp8 fp8_ds_mla; do timed dcp hash --dcp 1,2,4,8 --layout $layout 2>&1 | tail -2; done
  for k in regress/pre-54908 regress/pre-50005; do timed dcp hash --dcp 1,4 --kernel "$k" 2>&1 | tail -2; done
}

commands() {
  step "dcpcheck run --dcp 4: default kernel and both regressions"
  timed dcp run --dcp 4 --json "$out/run-default.json" 2>&1 | tail -2
  for k in regress/pre-54908 regress/pre-50005; do
    timed dcp run --dcp 4 --kernel "$k" > "$out/run-${k#regress/}.txt" 2>&1
    grep -E "^FAIL" "$out/run-${k#regress/}.txt" | head -3; tail -1 "$out/run-${k#regress/}.txt"
    timed dcp run --dcp 1 --kernel "$k" 2>&1 | tail -2
  done
}

property() {
  step "property search, default kernel, ${EXAMPLES:-2000} examples (thorough: real presets)"
  DCPCHECK_HOME=$(mktemp -d) timed dcp run --dcp 4 --property-only --examples "${EXAMPLES:-2000}" \
    --profile thorough --stats 2>&1 | grep -E "^property|stats|FAIL|saved"
}

selftest() {
  step "selftest --profile thorough (every mutant; address-32bit at GPU scale)"
  DCPCHECK_HOME=$(mktemp -d) timed dcp selftest --profile thorough 2>&1 | tail -24
}

verify() {
  local jobs=(${JOBS:-tests faults commands property selftest})
  for job in "${jobs[@]}"; do "$job" > "$out/$job.log" 2>&1 & done
  wait
  for job in "${jobs[@]}"; do cat "$out/$job.log"; done
}

figures() {
  step "dcpcheck run --dcp 4 over the shipped scenarios (cold, then warm Triton cache)"
  export TRITON_CACHE_DIR=$(mktemp -d)
  timed dcp run --dcp 4 2>&1 | tail -2
  timed dcp run --dcp 4 2>&1 | tail -2
  unset TRITON_CACHE_DIR
  step "property search: regressions shrink and replay"
  for k in regress/pre-54908 regress/pre-50005; do
    timed dcp run --dcp 4 --kernel "$k" --property-only --examples 100 --stats 2>&1 | grep -E "property|saved|stats"
  done
  for f in "$DCPCHECK_HOME"/failures/shrunk-*.toml; do
    k=regress/$(basename "$f" | grep -o 'pre-[0-9]*')
    dcp repro "$f" --kernel "$k" > /dev/null 2>&1; a=$?; dcp repro "$f" > /dev/null 2>&1; b=$?
    echo "repro $(basename "$f"): $k exit $a, default exit $b"
  done
  step "benchmarks"
  timed python3 benchmarks/harness_overhead.py 2>&1 | tee "$out/overhead.txt"
  timed python3 benchmarks/kernel_bandwidth.py 2>&1 | tee "$out/bandwidth.txt"
  timed python3 benchmarks/gate_wall_time.py --only bisect 2>&1 | tee "$out/bisect.txt"
}

"${1:-verify}"
