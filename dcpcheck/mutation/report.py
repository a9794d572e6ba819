"""A mutation run's reports: the console's table and survivors, JSON and JUnit (written
atomically, like ``run``'s). Each survivor comes with its diff and the command that runs
it alone again."""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dcpcheck import __version__
from dcpcheck.files import write_atomic
from dcpcheck.kernels.loading import judged_file
from dcpcheck.mutation.campaign import UNREACHED, Campaign, Entry
from dcpcheck.mutation.runner import COUNTED_KILLED, SURVIVED


def replay(campaign: Campaign, entry: Entry) -> str:
    """The command that runs ``entry``'s mutant alone through the same gate."""
    gate = campaign.gate
    words = ["dcpcheck", "mutate", "--op", gate.op, "--kernel", gate.kernel]
    if gate.dcp:
        words += ["--dcp", ",".join(map(str, gate.dcp))]
    words += ["--mutant", entry.mutant.name]
    for scenario in gate.scenarios:
        words += ["--scenario", scenario]
    if gate.search:
        words += ["--search", str(gate.search)]
    return shlex.join(words)


def _entry_json(campaign: Campaign, entry: Entry) -> dict:
    record: dict = {
        "name": entry.mutant.name,
        "file": str(entry.mutant.path),
        "function": entry.mutant.function,
        "line": entry.mutant.line,
        "operator": entry.mutant.operator,
        "change": entry.mutant.change,
        "status": entry.status,
    }
    if entry.judged is not None:
        record["reason"] = entry.judged.reason
    elif entry.outcome is not None:
        outcome = entry.outcome
        record.update(scenario=outcome.scenario, check=outcome.check, detail=outcome.detail)
        record["by"] = outcome.by if outcome.outcome in COUNTED_KILLED else None
    if entry.status == SURVIVED:
        record["diff"] = entry.mutant.diff
        record["replay"] = replay(campaign, entry)
    return record


def to_json(campaign: Campaign) -> str:
    """The whole run: the gate, the files and their SHA256, the score (overall, per
    operator, per check, per scenario) and every mutant. No wall time: a rerun from the
    cache writes the same bytes."""
    gate = campaign.gate
    doc = {
        "dcpcheck": __version__,
        "op": gate.op,
        "kernel": gate.kernel,
        "gate": {
            "dcp": sorted({1, *gate.dcp}) if gate.dcp else "each scenario's",
            "scenarios": list(gate.scenarios),
            "search": gate.search,
        },
        "files": [f.reported() for f in map(judged_file, campaign.files)],
        "partial": campaign.interrupted or campaign.error is not None,
        "error": campaign.error,
        "score": None if campaign.score is None else round(campaign.score, 2),
        "summary": dict(sorted(campaign.statuses().items())),
        "by_operator": {
            op: {"killed": k, "counted": n} for op, (k, n) in campaign.by_operator().items()
        },
        "by_check": campaign.by_check(),
        "by_scenario": campaign.by_scenario(),
        "mutants": [_entry_json(campaign, e) for e in campaign.entries],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def to_junit(campaign: Campaign) -> str:
    """One testcase per mutant: a survivor fails (its diff the text), a killed one passes,
    an equivalent, not applicable or not compiled one is skipped with its reason; a run
    that ran none for an ``error`` has one ``baseline`` testcase, that error."""
    suite = ET.Element("testsuite", name=f"dcpcheck-mutate[{campaign.gate.kernel}]")
    counts = campaign.statuses()
    suite.set("tests", str(len(campaign.entries) + (campaign.error is not None)))
    suite.set("failures", str(counts.get(SURVIVED, 0)))
    if campaign.error is not None:
        suite.set("errors", "1")
        case = ET.SubElement(suite, "testcase", classname="baseline", name="baseline")
        ET.SubElement(case, "error", message=campaign.error)
    for entry in campaign.entries:
        case = ET.SubElement(
            suite, "testcase", classname=entry.mutant.operator, name=entry.mutant.name
        )
        if entry.status == SURVIVED:
            failure = ET.SubElement(case, "failure", message=f"survived: {replay(campaign, entry)}")
            failure.text = entry.mutant.diff
        elif entry.judged is not None:
            ET.SubElement(case, "skipped", message=f"{entry.status}: {entry.judged.reason}")
        elif entry.status not in COUNTED_KILLED:
            ET.SubElement(case, "skipped", message=f"{entry.status}: {entry.outcome.detail}")  # type: ignore[union-attr]
    return ET.tostring(suite, encoding="unicode") + "\n"


def write(campaign: Campaign, json_path: Path | None, junit_path: Path | None) -> None:
    if json_path is not None:
        write_atomic(json_path, to_json(campaign))
    if junit_path is not None:
        write_atomic(junit_path, to_junit(campaign))


def print_campaign(console: Console, campaign: Campaign) -> None:
    """The score, a table per operator, the checks and scenarios that kill, then every
    survivor with its diff and replay."""
    table = Table(title=f"mutants of {campaign.gate.kernel} ({campaign.gate.op})")
    for column in ("operator", "killed", "counted", "score"):
        table.add_column(column, justify="left" if column == "operator" else "right")
    for op, (killed, counted) in sorted(campaign.by_operator().items()):
        table.add_row(op, str(killed), str(counted), f"{100 * killed / counted:.0f}%")
    console.print(table)
    if campaign.by_check():
        kills = ", ".join(f"{check} {n}" for check, n in campaign.by_check().items())
        console.print(f"checks that fail on them: {kills}", markup=False)
    if campaign.by_scenario():
        first = ", ".join(f"{name} {n}" for name, n in campaign.by_scenario().items())
        console.print(f"first killed by: {first}", markup=False)
    unreached: dict[str, list[str]] = {}  # reason -> the functions, said once per reason
    for entry in campaign.entries:
        if entry.judged is None:
            continue
        if entry.status == UNREACHED:
            functions = unreached.setdefault(entry.judged.reason, [])
            functions += [entry.mutant.function] * (entry.mutant.function not in functions)
        else:
            console.print(
                f"{entry.status}: {entry.mutant.name}: {entry.judged.reason}", markup=False
            )
    for reason, functions in unreached.items():
        count = sum(1 for e in campaign.entries if e.judged and e.judged.reason == reason)
        console.print(
            f"unreached, not run: {count} mutant(s) of {', '.join(functions)}: {reason}",
            markup=False,
        )
    for entry in campaign.survivors:
        console.print(f"SURVIVED {entry.mutant.name}", markup=False)
        console.print(entry.mutant.diff.rstrip(), markup=False, highlight=False)
        console.print(f"  replay: {replay(campaign, entry)}", markup=False)
    counts = campaign.statuses()
    said = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in sorted(counts.items()))
    score = "no mutant counted" if campaign.score is None else f"score {campaign.score:.1f}%"
    partial = " (interrupted: what finished)" if campaign.interrupted else ""
    console.print(f"{len(campaign.entries)} mutant(s): {said}; {score}{partial}", markup=False)
