"""The tiny model's token streams through every release's DCP decode chain, and the table.

For each release, in its own process (``op_matrix``): ``dcpcheck hash --dcp 1,2,4,8
--kernel vllm==X --json ...``, whose decode steps run the release's slot-mapping routines,
its ``fused_norm_rope`` (from 0.28.0; the project's before), its Triton decode attention
and its merge, each as the release's runner and MLA backend call them
(``dcpcheck.e2e.chain``), through every merge path the release's MLA layer offers (from
0.18.0 the all-gather and reduce-scatter, its default, and the all-to-all;
``dcpcheck.ops.lse_combine.merge_paths``). A row gives where each stage came from, whether every DCP
size gave the DCP1 streams and the first divergence on each merge path (the default's
first), and the wall time. A release whose runner
takes an interleave of 1 only runs at 1 (the streams' own interleave of 4 is refused, exit
2). Used for BENCHMARKS.md's chain table:

    python3 benchmarks/chain_matrix.py --out out/chain

(The releases must be in the cache, ``$DCPCHECK_CACHE`` or ``~/.cache/dcpcheck``, or the
package registry reachable.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from op_matrix import dcpcheck, print_rows, start
from slot_mapping_matrix import RELEASES

STAGES = ("slot-mapping", "fused-norm-rope", "attention")


def _short(stage: dict | None) -> str:
    """Where a stage's kernel came from: ``project``, ``vllm`` (the release's default
    routine) or the release's routines it named."""
    if stage is None:
        return "-"
    if stage["spec"] == "default":
        return "project"
    parts = stage["spec"].split(" + ")
    return " + ".join(re.sub(r"vllm==[^:\s]+:?", "", part) or "vllm" for part in parts)


def _paths(doc: dict) -> tuple[str, str, str]:
    """The merge column, the streams' verdict and the first divergence (or what the path's
    kernel raised), each path's in turn (``hash --json``'s ``merge_paths``), the default's
    marked."""
    merges, verdicts, divergences = [], [], []
    for path in doc["merge_paths"]:
        name = path["path"] or "merge"
        merges.append(name + (" (default)" if path["default"] else "") + f": {_short(path)}")
        if path["error"]:
            verdict, divergence = "raised", path["error"][:160]
        else:
            verdict = "identical" if path["identical"] else "differs"
            divergence = (path["first_divergence"] or {}).get("summary", "-")
        verdicts.append(f"{name}: {verdict}")
        divergences.append(f"{name}: {divergence}")
    return "; ".join(merges), "; ".join(verdicts), "; ".join(divergences)


def judge(version: str, out: Path, sizes: str) -> str:
    """One row of the table (module docstring)."""
    report = out / f"{version}.json"
    command = ["hash", "--dcp", sizes, "--kernel", f"vllm=={version}", "--json", str(report)]
    done, seconds = dcpcheck(*command)
    interleave = ""
    if done.returncode == 2 and "interleave" in done.stderr:  # its runner's 1 only
        interleave = " (interleave 1)"
        done, more_seconds = dcpcheck(*command, "--interleave", "1")
        seconds += more_seconds
    if not report.is_file():
        why = (done.stderr.strip().splitlines() or ["?"])[-1][-160:]
        return f"| {version} | - | - | - | - | exit {done.returncode}: {why} | | {seconds:.0f} |"
    doc = json.loads(report.read_text())
    chain = doc.get("chain") or {}
    stages = " | ".join(_short(chain.get(name)) for name in STAGES)
    if doc["error"]:
        merge = _short(chain.get("merge"))
        verdict, divergence = f"error: {doc['error'][:160]}", "-"
    else:
        merge, verdict, divergence = _paths(doc)
    verdict += f"{interleave} (exit {done.returncode})"
    return f"| {version} | {stages} | {merge} | {verdict} | {divergence} | {seconds:.0f} |"


def main() -> None:
    args = start(
        __doc__, "out/chain", RELEASES, lambda a: [judge(a.row, a.out, a.dcp)], dcp="1,2,4,8"
    )
    print(
        "| release | slot mappings | fused op | attention | merge paths | streams | "
        "first divergence | s |\n|---|---|---|---|---|---|---|---|"
    )
    print_rows(args.versions, args.jobs)


if __name__ == "__main__":
    main()
