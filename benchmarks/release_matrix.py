"""Judge every released vLLM ``fused_norm_rope`` and print the verdict table.

For each release, in one process (``op_matrix``): ``dcpcheck run --kernel vllm==X --dcp
1,2,4,8`` over the shipped scenarios, once with the oracle (token streams included) and
once with ``--oracle off`` (without them: the streams do not use the oracle, so they run
once); the JSON reports are kept under ``--out``. The table gives, per DCP size, the exit
verdict and the fields of the failing findings (with where the first bad token is:
foreign/owned/padding), and per release how many checks ran and were skipped and every
limitation with its reason. Used for the README's and BENCHMARKS.md's release table:

    DCPCHECK_CACHE=.dcpcheck-cache python3 benchmarks/release_matrix.py --out out/releases

(The releases must be in the cache, or the package registry reachable.)
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from op_matrix import add_row_options, dcpcheck, end, finish_row, rows

RELEASES = (
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)


def run_release(version: str, dcp: str, oracle: str, extra: list[str], out: Path) -> dict:
    """The release's report at ``oracle``, with the run's exit code and wall time."""
    report = out / f"vllm-{version}-oracle-{oracle}.json"
    done, seconds = dcpcheck(
        "run", "--kernel", f"vllm=={version}", "--dcp", dcp, "--oracle", oracle,
        "--json", str(report), *extra,
    )  # fmt: skip
    if not report.is_file():
        said = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"no report (exit {done.returncode}): {said}", "seconds": seconds}
    doc = json.loads(report.read_text())
    doc["exit"], doc["seconds"] = done.returncode, seconds
    return doc


def judge(version: str, dcp: str, oracles: list[str], extra: list[str], out: Path) -> list[str]:
    """The release's row at each oracle setting (module docstring), each a JSON line: the
    table's line and the limitations."""
    lines = []
    for oracle in oracles:
        tokens = ["--no-tokens"] if oracle == "off" and "on" in oracles else []
        doc = run_release(version, dcp, oracle, [*extra, *tokens], out)
        if "error" in doc:
            line, limits = f"| {version} | {doc['error']} | | {doc['seconds']:.1f} |", {}
        else:
            text, counts, limits = summarize(doc)
            cells = " | ".join(text.get(int(d), "-") for d in dcp.split(","))
            ran = counts["pass"] + counts["fail"]
            line = (
                f"| {version} (exit {doc['exit']}) | {cells} | {ran} ran, "
                f"{counts['skip']} skipped | {doc['seconds']:.1f} |"
            )
        lines.append(json.dumps({"line": line, "limits": limits}))
    return lines


def summarize(doc: dict) -> tuple[dict[int, str], Counter, dict[str, str]]:
    """Per DCP size the verdict text (the failing scenarios, then what failed); check
    counts; the limitations (skip reasons that come from the adapter, i.e. the
    ``check[field]`` entries)."""
    verdicts: dict[int, set[str]] = defaultdict(set)
    failing: dict[int, set[str]] = defaultdict(set)
    cases: Counter = Counter()
    not_applicable: dict[int, set[str]] = defaultdict(set)  # never run here (its reason)
    counts: Counter = Counter()
    limitations: dict[str, str] = {}
    for case in doc["cases"]:
        dcp = case["dcp"]
        cases[dcp] += 1
        if case["status"] == "not_applicable":
            not_applicable[dcp].add(case["scenario"])
        elif case["status"] in ("error", "crash", "timeout", "nondeterministic"):
            failing[dcp].add(case["scenario"])
            verdicts[dcp].add(f"{case['status']}: {case['error']}")
        for check in case["checks"]:
            counts[check["status"]] += 1
            if check["status"] == "skip" and "[" in check["check"]:
                limitations[check["check"]] = check["skipped"]
            if check["status"] == "fail":
                failing[dcp].add(case["scenario"])
                for finding in check["findings"]:
                    where = finding.get("ownership") or "-"
                    verdicts[dcp].add(f"{check['check']}: {finding['field']} ({where})")
    text = {}
    for dcp in sorted(cases):
        skipped = sorted(not_applicable[dcp])
        na = f"; N/A: {', '.join(skipped)}" if skipped else ""
        ran = cases[dcp] - len(skipped)
        if not failing[dcp]:
            text[dcp] = f"pass ({ran} cases{na})"
            continue
        names = sorted(failing[dcp])
        which = ", ".join(names) if len(names) <= 3 else f"{len(names)} scenarios"
        text[dcp] = f"FAIL {which} of {ran}{na}: " + "; ".join(sorted(verdicts[dcp]))
    return text, counts, limitations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--dcp", default="1,2,4,8")
    parser.add_argument("--out", type=Path, default=Path("out/releases"))
    parser.add_argument("--oracle", default="on,off", help="on, off or on,off")
    add_row_options(parser)
    parser.add_argument("extra", nargs="*", help="more `dcpcheck run` options, after --")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    oracles = args.oracle.split(",")
    if args.row:
        finish_row(*judge(args.row, args.dcp, oracles, args.extra, args.out))
    versions = args.releases.split(",")
    table: dict[str, list[dict]] = {oracle: [] for oracle in oracles}
    for version, lines in zip(versions, rows(versions, args.jobs), strict=True):
        for oracle, line in zip(oracles, lines, strict=False):
            row = json.loads(line) if line.startswith("{") else {"line": line, "limits": {}}
            table[oracle].append({"version": version, **row})
    for oracle in oracles:
        print(f"\n### oracle {oracle}\n")
        sizes = args.dcp.split(",")
        print("| release | " + " | ".join(f"DCP{d}" for d in sizes) + " | checks | s |")
        print("| --- | " + " | ".join("---" for _ in sizes) + " | --- | --- |")
        print("\n".join(row["line"] for row in table[oracle]))
        print("\nLimitations (skipped, with the reason):")
        for row in table[oracle]:
            for check, reason in sorted(row["limits"].items()):
                print(f"- {row['version']} `{check}`: {reason}")
    end()


if __name__ == "__main__":
    main()
