#!/usr/bin/env bash
# Issue 19's figures for two trees, one after the other on an otherwise idle machine: the
# gate (`dcpcheck run --dcp 4`, cold and warm Triton cache), the property search at DCP4
# (ci profile, $EXAMPLES examples, default 200) and the PR-54908 regression found and shrunk from an empty
# home. OLD is a checkout of the tree to compare with (e.g. `git worktree add OLD <rev>`).
# Usage: bash benchmarks/side_by_side.sh OLD [NEW]      (NEW: this checkout)
set -u
OLD=$1
NEW=${2:-$(cd "$(dirname "$0")/.." && pwd)}
for tree in "$OLD" "$NEW"; do
  echo "== $tree ($(git -C "$tree" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
  ( cd "$tree" && python3 benchmarks/gate_wall_time.py --only run --only property --examples "${EXAMPLES:-200}" )
  home=$(mktemp -d)
  start=$SECONDS
  ( cd "$tree" && python3 -m dcpcheck run --dcp 4 --kernel regress/pre-54908 --property-only \
      --examples 100 --home "$home" > "$home/out.txt" 2>&1 )
  rc=$?
  echo "pre-54908 found and shrunk from an empty home: $((SECONDS - start)) s, exit $rc:" \
    "$(grep -m1 'property: FAIL' "$home/out.txt")"
  rm -rf "$home"
done
