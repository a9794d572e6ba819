"""Machine-readable reports: JSON and JUnit XML, written atomically and deterministically.

Same inputs and seed give the same bytes: no timestamps, no wall times, sorted keys.
A report is written to a temporary file beside its target and renamed over it, so a
reader (CI, a crashed run's post-mortem) never sees half a file.

Both say whether the oracle judged the run (``--oracle on|off``: JSON ``"oracle"``, a JUnit
suite property), and a check judged in its oracle-free form says what it compared with
instead (JSON ``"without_oracle"``, a JUnit testcase property), so a pass without the
oracle never reads as a pass against it.
"""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path

from dcpcheck import __version__
from dcpcheck.runner import STATUSES, CaseResult

UNCHECKED_STATUSES = ("error", "crash", "timeout")
"""Statuses of a case whose checks never ran: the kernel raised, its worker died, or it
ran out of time. JUnit reports each as one ``<error>`` whose ``type`` is the status."""


class ReportPathError(ValueError):
    """An output path that cannot be written; raised before any work starts."""


def ensure_writable(path: Path) -> None:
    """Fail early, with one line, if ``path`` cannot be written as a report.

    The test is the real thing: a temporary file is created beside ``path`` (and removed),
    as ``write_atomic`` will do at the end. Permission bits alone can say yes where the
    write fails (read-only mounts, ``/proc``, a full quota).
    """
    if path.is_dir():
        raise ReportPathError(f"{path}: is a directory, expected a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ReportPathError(f"{path}: directory {parent} does not exist")
    _probe(parent, f"{path}: directory {parent} is not writable")


def ensure_directory_writable(directory: Path) -> None:
    """Fail early if files cannot be created under ``directory``, which need not exist yet
    (it is created on first use): its nearest existing ancestor must be a writable one."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ReportPathError(f"{directory}: {existing} is not a directory")
    _probe(existing, f"{directory}: cannot create files under {existing}")


def _probe(directory: Path, problem: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".dcpcheck-probe.")
    except OSError as exc:
        raise ReportPathError(f"{problem} ({exc.strerror})") from None
    os.close(fd)
    Path(probe).unlink()


def _creation_mode() -> int:
    """The mode ``open()`` gives a new file (0o666 less the umask): ``mkstemp`` uses 0o600,
    and a report CI or a colleague cannot read is a report lost."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``content`` to a temporary file beside ``path``, then rename it over ``path``."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _creation_mode())
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def oracle_word(oracle: bool) -> str:
    """How reports spell ``RunConfig.oracle``: as the ``--oracle`` option does."""
    return "on" if oracle else "off"


def to_json(
    results: list[CaseResult], *, kernel: str, backend: str, partial: bool, oracle: bool = True
) -> str:
    doc = {
        "dcpcheck": __version__,
        "kernel": kernel,
        "backend": backend,
        "oracle": oracle_word(oracle),
        "partial": partial,
        "summary": summarize(results),
        "cases": [_case_json(r) for r in results],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def to_junit(results: list[CaseResult], *, kernel: str, partial: bool, oracle: bool = True) -> str:
    """One testcase per scenario x DCP size x check; one ``launch`` testcase with an
    ``<error>`` for a case whose checks never ran (``UNCHECKED_STATUSES``)."""
    suite = ET.Element("testsuite", name=f"dcpcheck[{kernel}]")
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="oracle", value=oracle_word(oracle))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for r in results:
        classname = f"{r.scenario}[dcp{r.dcp_size}]"
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
    for key, value in counts.items():
        suite.set(key, str(value))
    if partial:
        ET.SubElement(properties, "property", name="partial", value="true")
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def format_finding(check: str, f) -> str:
    """One line a kernel engineer can act on."""
    where = f"rank {f.rank}" if f.rank is not None else "all ranks"
    token = f", first bad token {f.token} ({f.ownership})" if f.token is not None else ""
    err = f", max error {f.max_error}" if f.max_error else ""
    return f"{check}: {f.field} on {where}{token}{err}: {f.detail}"
