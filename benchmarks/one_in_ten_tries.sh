#!/usr/bin/env bash
# The one-in-ten flaky kernel (one ulp on one q_out element, about one call in ten, its draws
# from the OS) through the named run and the property search, TRIES times each with
# --seed fixed: every try must say NONDETERMINISTIC and no case may read as a DCP failure.
# Usage: TRIES=10 [PYTHON=.venv/bin/python] bash benchmarks/one_in_ten_tries.sh (repo root)
set -u
TRIES=${TRIES:-10}
WORK=$(mktemp -d)
KERNEL=tests.kernels_under_test:one_in_ten
PYTHON=${PYTHON:-python3}
for i in $(seq "$TRIES"); do
  "$PYTHON" -m dcpcheck run --kernel $KERNEL --dcp 4 --seed 0 --no-tokens --home "$WORK/h$i" \
    --json "$WORK/run$i.json" > /dev/null 2>&1
  "$PYTHON" -m dcpcheck run --kernel $KERNEL --dcp 4 --seed 0 --property-only --profile ci \
    --home "$WORK/p$i" --json "$WORK/search$i.json" > "$WORK/search$i.log" 2>&1
  "$PYTHON" - "$WORK/run$i.json" "$WORK/search$i.json" "$i" <<'PY'
import collections, json, sys
run, search, i = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
statuses = collections.Counter(c["status"] for c in run["cases"])
checks = search["search"]["failed_checks"]
named = "nondeterministic" if statuses["nondeterministic"] and not statuses["fail"] else "WRONG"
found = "nondeterministic" if {"deterministic", "flaky"} & set(checks) else "WRONG"
print(f"try {i}: named run {named} {dict(statuses)}; search {found} {checks}")
PY
done
rm -rf "$WORK"
