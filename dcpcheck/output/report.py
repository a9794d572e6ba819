"""Machine-readable reports: JSON and JUnit XML, written atomically and deterministically.

Same inputs and seed give the same bytes: no timestamps, no wall times, sorted keys.
:func:`write_reports` writes both through ``files.write_atomic``: a regular file is
replaced by a rename, so a reader (CI, a crashed run's post-mortem) never sees half a file.

Both name the op judged (JSON ``"op"``, a JUnit ``op`` suite property) and every file the
judged kernel's code comes from with its SHA256 (JSON ``"kernel_files"``, a JUnit
``kernel_file`` suite property each: ``SHA256  PATH``), so a verdict is tied to the bytes
it is about, not only to a name such as ``vllm==0.30.0``.

Both say whether the oracle judged the run (``--oracle on|off``: JSON ``"oracle"``, a JUnit
suite property), and a check judged in its oracle-free form says what it compared with
instead (JSON ``"without_oracle"``, a JUnit testcase property), so a pass without the
oracle never reads as a pass against it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from dcpcheck import __version__, files
from dcpcheck.backend import Backend
from dcpcheck.cases.verdicts import STATUSES, CaseResult, RunConfig, format_finding
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.ops.session_cases import SearchAsked, SearchDone

UNCHECKED_STATUSES = ("error", "crash", "timeout")
"""Statuses of a case whose checks never ran: the kernel raised, its worker died, or it
ran out of time. JUnit reports each as one ``<error>`` whose ``type`` is the status."""


def summarize(results: list[CaseResult]) -> dict[str, int]:
    """Cases, then a count per status, every status present (a stable JSON schema)."""
    counts = {"cases": len(results), **dict.fromkeys(STATUSES, 0)}
    for r in results:
        counts[r.status] += 1
    return counts


def _case_json(r: CaseResult) -> dict:
    return {
        "scenario": r.scenario,
        "dcp": r.dcp_size,
        "status": r.status,
        "error": r.error,
        "replay": r.replay,
        "checks": [
            {
                "check": c.check,
                "status": "skip" if c.skipped else ("pass" if c.passed else "fail"),
                "skipped": c.skipped,
                "without_oracle": c.without_oracle,
                "findings": [asdict(f) for f in c.findings],
            }
            for c in r.checks
        ],
    }


Search = tuple[SearchAsked, SearchDone]
"""A property search as the reports record it: what it was asked, what it did."""


def search_record(searched: Search) -> dict:
    """What a property search did, with what it needs to be run again: its profile, seed and
    DCP sizes, the examples asked for and run, its verdict, the failed checks and the saved
    failure (its replay is among the cases). No wall time (the reports are deterministic)."""
    config, result = searched
    return {
        "profile": config.profile_name,
        "seed": config.seed_used,
        "dcp": None if config.dcp_sizes is None else list(config.dcp_sizes),
        "examples_requested": config.max_examples,
        "examples_run": result.examples_run,
        "scenarios_run": result.scenarios_run,
        "status": "pass" if result.passed else "fail",
        "failed_checks": list(result.failed_checks),
        "saved": None if result.saved_path is None else str(result.saved_path),
    }


def oracle_word(oracle: bool) -> str:
    """How reports spell ``RunConfig.oracle``: as the ``--oracle`` option does."""
    return "on" if oracle else "off"


def to_json(
    results: list[CaseResult],
    *,
    kernel: str,
    backend: str,
    partial: bool,
    oracle: bool = True,
    searched: Search | None = None,
    kernel_files: Sequence[JudgedFile] = (),
    op: str,
) -> str:
    """The report; ``"search"`` only where a property search ran (``search_record``)."""
    doc = {
        "dcpcheck": __version__,
        "op": op,
        "kernel": kernel,
        "kernel_files": [f.reported() for f in kernel_files],
        "backend": backend,
        "oracle": oracle_word(oracle),
        "partial": partial,
        "summary": summarize(results),
        "cases": [_case_json(r) for r in results],
    }
    if searched is not None:
        doc["search"] = search_record(searched)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def to_junit(
    results: list[CaseResult],
    *,
    kernel: str,
    partial: bool,
    oracle: bool = True,
    searched: Search | None = None,
    kernel_files: Sequence[JudgedFile] = (),
    op: str,
) -> str:
    """One testcase per scenario x DCP size x check; one ``launch`` testcase with an
    ``<error>`` for a case whose checks never ran (``UNCHECKED_STATUSES``), a ``<skipped>``
    one for a case not applicable on this machine (its reason the message); one
    ``property-search`` testcase where a search ran, its record as properties."""
    suite = ET.Element("testsuite", name=f"dcpcheck[{kernel}]")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="op", value=op)
    ET.SubElement(properties, "property", name="oracle", value=oracle_word(oracle))
    for judged in kernel_files:
        value = f"{judged.sha256}  {judged.path}"
        ET.SubElement(properties, "property", name="kernel_file", value=value)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for r in results:
        classname = f"{r.scenario}[dcp{r.dcp_size}]"
        if r.status == "not_applicable":
            case = ET.SubElement(suite, "testcase", classname=classname, name="launch")
            ET.SubElement(case, "skipped", message=r.error or "")
            counts["tests"] += 1
            counts["skipped"] += 1
            continue
        if r.status in UNCHECKED_STATUSES:
            case = ET.SubElement(suite, "testcase", classname=classname, name="launch")
            error = ET.SubElement(case, "error", type=r.status, message=r.error or "")
            error.text = r.replay
            counts["tests"] += 1
            counts["errors"] += 1
            continue
        for c in r.checks:
            case = ET.SubElement(suite, "testcase", classname=classname, name=c.check)
            counts["tests"] += 1
            if c.without_oracle:
                ET.SubElement(
                    ET.SubElement(case, "properties"),
                    "property",
                    name="without_oracle",
                    value=c.without_oracle,
                )
            if c.skipped:
                ET.SubElement(case, "skipped", message=c.skipped)
                counts["skipped"] += 1
            elif c.findings:
                lines = [format_finding(c.check, f) for f in c.findings]
                first = lines[0]
                ET.SubElement(case, "failure", message=first).text = "\n".join(
                    [*lines, f"replay: {r.replay}"]
                )
                counts["failures"] += 1
    if searched is not None:
        record = search_record(searched)
        case = ET.SubElement(suite, "testcase", classname="property-search", name="contract")
        props = ET.SubElement(case, "properties")
        shown = ("profile", "seed", "dcp", "examples_requested", "examples_run", "scenarios_run")
        for name in (*shown, "saved"):
            if record[name] is not None:
                value = record[name]
                text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
                ET.SubElement(props, "property", name=name, value=text)
        counts["tests"] += 1
        if record["status"] == "fail":
            message = f"failed: {', '.join(record['failed_checks'])}"
            failure = ET.SubElement(case, "failure", message=message)
            failure.text = f"saved: {record['saved']}"
            counts["failures"] += 1
    for key, value in counts.items():
        suite.set(key, str(value))
    if partial:
        ET.SubElement(properties, "property", name="partial", value="true")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(
    results: Sequence[CaseResult],
    config: RunConfig,
    backend: Backend,
    json_path: Path | None,
    junit_path: Path | None,
    *,
    partial: bool,
    searched: Search | None = None,
    kernel_files: Sequence[JudgedFile] = (),
    op: str,
) -> None:
    """Both reports (``files.write_atomic``) of a run of ``op``, naming ``kernel_files``
    (what the kernel's code was read from); :class:`ReportNotWritten` if a path cannot be
    written."""
    backend_name = "interpreter" if backend.interpreted else "cuda"
    reports = []
    if json_path is not None:
        text = to_json(
            list(results),
            kernel=config.kernel_name,
            backend=backend_name,
            partial=partial,
            oracle=config.oracle,
            searched=searched,
            kernel_files=kernel_files,
            op=op,
        )
        reports.append((json_path, text))
    if junit_path is not None:
        text = to_junit(
            list(results),
            kernel=config.kernel_name,
            partial=partial,
            oracle=config.oracle,
            searched=searched,
            kernel_files=kernel_files,
            op=op,
        )
        reports.append((junit_path, text))
    for path, text in reports:
        try:
            files.write_atomic(path, text)
        except OSError as exc:
            raise ReportNotWritten(f"{path}: cannot write the report: {exc.strerror}") from None


class ReportNotWritten(Exception):
    """A report path that could be written when the run began cannot be now (the disk
    filled up, a mount went away): one line naming the path and the reason."""
