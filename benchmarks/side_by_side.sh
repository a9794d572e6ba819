#!/usr/bin/env bash
# The speed figures for two trees, one after the other on an otherwise idle machine: the
# gate (`dcpcheck run --dcp 4`, cold and warm Triton cache, binaries compiled) and the
# property search at DCP4 (ci profile, $EXAMPLES examples, default 200; first and warm),
# each timed by this checkout's gate_wall_time.py; the PR-54908 regression found and
# shrunk from an empty home (Triton cache warm); then each tree's own harness_overhead.py
# and kernel_bandwidth.py (4,096 and 65,536 tokens); last, the warm gate's phases in NEW
# (command_phases.py). OLD is a checkout of the tree to compare with (e.g. `git worktree add
# OLD <rev>`).
#
# Python's own bytecode is cached under a writable PYTHONPYCACHEPREFIX: on the lent GPU
# machine torch's site-packages are read-only and ship no .pyc, and PYTHONDONTWRITEBYTECODE
# is set, so without both every Python process compiles torch's sources again (2.9 s of an
# 11.4 s profile), a cost no user with an ordinary install pays. The first command warms it.
# Usage: bash benchmarks/side_by_side.sh OLD [NEW]      (NEW: this checkout)
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
OLD=$1
NEW=${2:-$HERE}
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$(mktemp -d)}
unset PYTHONDONTWRITEBYTECODE  # else the prefix above is never written
python3 -c "import torch, triton, hypothesis, rich, click" # bytecode of the libraries, once
for tree in "$OLD" "$NEW"; do
  tree=$(cd "$tree" && pwd)  # absolute: the overhead and bandwidth scripts run from inside it
  # A copy made with `git archive` sits inside this checkout: rev-parse would name ours.
  if [ -e "$tree/.git" ]; then rev=$(git -C "$tree" rev-parse --short HEAD); else rev="a copy, no git"; fi
  echo "== $tree ($rev)"
  python3 "$HERE/benchmarks/gate_wall_time.py" --tree "$tree" --only run --only property \
    --examples "${EXAMPLES:-200}"
  home=$(mktemp -d)
  ( cd "$tree" && python3 -m dcpcheck run --dcp 4 --kernel regress/pre-54908 --property-only \
      --examples 100 --home "$home/warmup" > /dev/null 2>&1 )  # the Triton cache, warm
  start=$(date +%s%N)
  ( cd "$tree" && python3 -m dcpcheck run --dcp 4 --kernel regress/pre-54908 --property-only \
      --examples 100 --home "$home/empty" > "$home/out.txt" 2>&1 )
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "pre-54908 found and shrunk from an empty home: ${ms} ms, exit $rc:" \
    "$(grep -m1 'property: FAIL' "$home/out.txt")"
  rm -rf "$home"
  for script in "harness_overhead.py" "kernel_bandwidth.py --no-eager --tokens 4096,65536"; do
    echo "-- $script"
    ( cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/$script 2>&1 )
  done
done
# Where the warm gate's time goes in this checkout (command_phases.py needs its entry point,
# so NEW only), then its wall time from outside: the difference is starting and leaving Python.
echo "== phases of the warm gate, $NEW"
# gate_wall_time.py ran the gate with caches of its own: fill the default one first, so
# that the phases are a warm run's.
( cd "$NEW" && python3 -m dcpcheck run --dcp 4 > /dev/null 2>&1 )
start=$(date +%s%N)
( cd "$NEW" && PYTHONPATH="$NEW${PYTHONPATH:+:$PYTHONPATH}" python3 benchmarks/command_phases.py -- run --dcp 4 \
    2>&1 >/dev/null | grep '^\[phase\]' )
echo "wall: $(( ($(date +%s%N) - start) / 1000000 )) ms"
