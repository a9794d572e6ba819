#!/usr/bin/env bash
# Every GPU figure and acceptance command of the issues, in one go, on a CUDA box that has
# torch and triton (no network): logs go to $OUT (or ./gpu-logs).
#   bash benchmarks/gpu_acceptance.sh [quick]
set -u
out=${OUT:-gpu-logs}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
step() { echo; echo "=== $*"; }
t() { local s=$(date +%s%N); "$@"; local rc=$?; echo "[exit $rc, $(( ($(date +%s%N) - s) / 1000000 )) ms]"; }

step "environment"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'

step "test suite on the GPU (real shapes, golden vectors)"
t python3 -m pytest -q -x -p no:cacheprovider 2>&1 | tail -25 | tee "$out/pytest.log"

step "dcpcheck run --dcp 4 (default, both regressions, DCP1)"
for k in default regress/pre-54908 regress/pre-50005; do
  t python3 -m dcpcheck run --dcp 4 --kernel "$k" --json "$out/run-${k//\//_}.json" > "$out/run-${k//\//_}.txt" 2>&1
  tail -3 "$out/run-${k//\//_}.txt"
done
for k in regress/pre-54908 regress/pre-50005; do
  t python3 -m dcpcheck run --dcp 1 --kernel "$k" --no-tokens 2>&1 | tail -1
done

step "token streams at real dims: DCP 1,2,4,8 per layout; regressions"
for layout in auto fp8 fp8_ds_mla; do
  t python3 -m dcpcheck hash --dcp 1,2,4,8 --layout $layout 2>&1 | tail -2
done
for k in regress/pre-54908 regress/pre-50005; do
  t python3 -m dcpcheck hash --dcp 1,4 --kernel "$k" 2>&1 | tail -1
done

step "property search"
export DCPCHECK_HOME=$(mktemp -d)
for k in regress/pre-54908 regress/pre-50005; do
  t python3 -m dcpcheck run --dcp 4 --kernel "$k" --property-only --examples 100 --stats 2>&1 | grep -E "property|saved|stats"
done
for f in "$DCPCHECK_HOME"/failures/*.toml; do
  k=$(grep -o 'regress-pre-[0-9]*' <<<"$f" | sed 's/regress-/regress\//')
  python3 -m dcpcheck repro "$f" --kernel "$k" > /dev/null 2>&1; a=$?
  python3 -m dcpcheck repro "$f" > /dev/null 2>&1; b=$?
  echo "repro $(basename "$f"): $k exit $a, default exit $b"
done
[ "${1:-}" = quick ] && n=300 || n=2000
t python3 -m dcpcheck run --dcp 4 --property-only --examples $n --profile thorough --stats 2>&1 | grep -E "property|stats"

step "benchmarks"
t python3 benchmarks/gate_wall_time.py --examples 200 2>&1 | tee "$out/gate.log"
t python3 benchmarks/harness_overhead.py 2>&1 | tee "$out/overhead.log"
t python3 benchmarks/kernel_bandwidth.py ${1:+--quick} 2>&1 | tee "$out/bandwidth.log"
