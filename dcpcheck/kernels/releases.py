"""Released kernels as test subjects: ``--kernel vllm==0.29.0`` names the fused MLA kernel
file of that published vLLM wheel.

The first use of a release downloads its wheel with pip (``pip download --no-deps``, the
package index pip is configured for), keeps only the kernel file, in a cache outside the
checkout, and deletes the wheel (about 330 MB); later uses, offline ones included, read the
cache. Nothing of vLLM is ever written into the repository. The cache lives in
``$DCPCHECK_CACHE`` or else ``~/.cache/dcpcheck``::

    <cache>/releases/vllm/0.29.0/kernels.py     the file, as the wheel holds it
    <cache>/releases/vllm/0.29.0/source.json    wheel name, member path, sha256 of the file

The loaded file goes through the same loader and adapter as any ``file.py:function``
(dcpcheck.kernels.loading): the vLLM stand-ins answer its imports, and the adapter calls it
the way that release's own caller does. What a release name adds is what its source says
and its signature cannot: the fp8_ds_mla tile-scale rule it writes
(:func:`ds_mla_scale_of`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dcpcheck.contract import DsMlaScale
from dcpcheck.files import write_atomic

PACKAGE = "vllm"
KERNEL_MEMBER = "vllm/models/deepseek_v32/common/kernels.py"
"""Where every release from 0.28.0 on keeps ``fused_norm_rope`` in its wheel."""

DEFAULT_FUNCTION = "fused_norm_rope"

RELEASE_SPEC = re.compile(
    r"^vllm==(?P<version>\d+(?:\.\d+)*(?:[.\-+\w]*)?)(?::(?P<function>\w+))?$"
)
"""``vllm==X.Y.Z`` or ``vllm==X.Y.Z:function``."""

POW2_DS_MLA_SCALE_FROM = (0, 31)
"""From 0.31.0 on, vLLM's fp8_ds_mla tile scales are powers of two (its kernel rounds
``amax * (1/448)``, floored at 1e-4, up to one); up to 0.30.0 they are
``max(amax * (1/448), FLT_MIN)`` as computed (read from each release's kernels.py)."""

PIP_TIMEOUT_S = 900
"""A wheel is about 330 MB; a slow index may take minutes, a dead one should not hang CI."""


class ReleaseError(RuntimeError):
    """A release cannot be had: not cached and not downloadable, or its wheel lacks the
    kernel file. One line; the CLI reports it as a kernel that cannot be loaded."""


@dataclass(frozen=True)
class ReleaseSpec:
    """A parsed ``vllm==X`` kernel spec."""

    version: str
    function: str = DEFAULT_FUNCTION

    @property
    def name(self) -> str:
        return f"{PACKAGE}=={self.version}"


def parse_spec(spec: str) -> ReleaseSpec | None:
    """``spec`` as a release, or None when it does not name one."""
    match = RELEASE_SPEC.match(spec)
    if match is None:
        return None
    return ReleaseSpec(match["version"], match["function"] or DEFAULT_FUNCTION)


def version_key(version: str) -> tuple[int, ...]:
    """The leading numeric components of ``version``, for ordering releases."""
    parts = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(parts)


def ds_mla_scale_of(version: str) -> DsMlaScale:
    """The fp8_ds_mla tile-scale rule release ``version`` writes (POW2_DS_MLA_SCALE_FROM)."""
    if version_key(version) >= POW2_DS_MLA_SCALE_FROM:
        return DsMlaScale.POW2
    return DsMlaScale.AMAX


def cache_root() -> Path:
    """``$DCPCHECK_CACHE``, else ``~/.cache/dcpcheck``."""
    configured = os.environ.get("DCPCHECK_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "dcpcheck"


def cached_kernel_file(version: str) -> Path:
    return cache_root() / "releases" / PACKAGE / version / Path(KERNEL_MEMBER).name


def _download_wheel(version: str, into: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(into),
        f"{PACKAGE}=={version}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReleaseError(
            f"{PACKAGE}=={version}: pip download took over {PIP_TIMEOUT_S} s"
        ) from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        why = errors[-1].removeprefix("ERROR: ") if errors else f"pip exited {done.returncode}"
        raise ReleaseError(
            f"{PACKAGE}=={version} is not in dcpcheck's cache ({cache_root()}) and could not "
            f"be downloaded: {why}"
        )
    return wheels[0]


def fetch(version: str) -> Path:
    """The kernel file of release ``version``: from the cache, else downloaded into it
    (module docstring). Raises :class:`ReleaseError` with one line when neither works."""
    target = cached_kernel_file(version)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="wheel-") as tmp:
        wheel = _download_wheel(version, Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as archive:
                source = archive.read(KERNEL_MEMBER)
        except KeyError:
            raise ReleaseError(f"{PACKAGE}=={version}: its wheel has no {KERNEL_MEMBER}") from None
        except zipfile.BadZipFile as exc:
            raise ReleaseError(f"{PACKAGE}=={version}: {wheel.name}: {exc}") from None
        provenance = {
            "package": PACKAGE,
            "version": version,
            "wheel": wheel.name,
            "member": KERNEL_MEMBER,
            "sha256": hashlib.sha256(source).hexdigest(),
        }
        write_atomic(
            target.with_name("source.json"), json.dumps(provenance, indent=2).encode() + b"\n"
        )
        write_atomic(target, source)
    return target  # the wheel went with the temporary directory
