"""Every option that reaches a run, declared once: its spelling, type, default, help, the
config field it sets, and the commands that take it. The click options of ``dcpcheck
run``, ``dcpcheck repro`` and a rank process's ``run`` (``dcpcheck.cli.options``) and the
pytest plugin's ``--dcpcheck-*`` options (``dcpcheck.pytest_plugin``) are generated from
these records; which ops take an option is each op's registry record
(``op_registry.Op.run_options``).

Torch-free (the plugin reads it while pytest starts, before any kernel is asked for):
what only the fused op's harness knows (its search profiles, the sanitizer's tools, the
tile-scale rules, the harness's timeouts) is a :class:`Fill` here, filled in by the command
line, which imports the harness anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dcpcheck import files
from dcpcheck.cases.limits import SEED_MAX, TIMEOUT_MAX_S
from dcpcheck.op_registry import DEFAULT_OP, OPS

PYTEST_PREFIX = "--dcpcheck-"

DEMANDS = "demands"
"""The field of an op's own option that changes what a case demands of a kernel: it sets
no field of its own, but joins the config's ``demands`` as ``(name, value)``
(``RunConfig.demands``), which the op reads and a replay repeats."""
"""The pytest plugin spells option ``NAME`` as ``--dcpcheck-NAME``."""


@dataclass(frozen=True)
class Fill:
    """A value only the harness knows, named by ``key``: the command line fills it in
    (``Option.on``)."""

    key: str


@dataclass(frozen=True)
class Option:
    """One option. ``kind``: ``text``, ``int``, ``float`` (``low``/``high`` bound them),
    ``path``, ``dir`` (a path that is no file), ``choice``, ``flag`` (on when given) or
    ``switch`` (``--NAME/--no-NAME``, None when neither is given). ``field``: the keyword of
    ``RunConfig`` / ``SearchConfig`` its value sets (None: it steers the command, not the
    config; ``DEMANDS``: it joins the config's ``demands``). ``variants``: per command
    (``repro``, ``ranks``, ``pytest``), the attributes whose wording or default differ
    there. Help text may name fills as ``{key}``."""

    name: str  # --NAME on the command line, --dcpcheck-NAME in pytest
    help: str
    dest: str = ""  # the parameter its value is kept under; default: NAME with _
    kind: str = "text"
    default: Any = None
    choices: tuple[str, ...] | Fill = ()
    low: float | None = None
    high: float | None = None
    metavar: str | None = None
    multiple: bool = False
    short: str | None = None  # e.g. -x
    envvar: str | None = None
    field: str | None = None
    variants: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def flag(self) -> str:
        """How the command line spells it (its long form)."""
        return f"--{self.name}"

    @property
    def pytest_flag(self) -> str:
        """How the pytest plugin spells it."""
        return f"{PYTEST_PREFIX}{self.name}"

    @property
    def key(self) -> str:
        """The parameter its value is kept under."""
        return self.dest or self.name.replace("-", "_")

    @property
    def show_default(self) -> bool:
        """Whether the help shows the default: every default a value, not a flag's off."""
        return self.default is not None and self.kind not in ("flag", "switch")

    def on(self, command: str, fills: Mapping[str, Any] | None = None) -> Option:
        """This option as ``command`` takes it, its :class:`Fill` values and help's
        ``{key}`` names filled from ``fills``."""
        fills = fills or {}
        option = dataclasses.replace(self, **self.variants.get(command, {}))

        def filled(value: Any) -> Any:
            return fills[value.key] if isinstance(value, Fill) else value

        return dataclasses.replace(
            option,
            help=option.help.format(**fills),
            default=filled(option.default),
            choices=filled(option.choices),
        )


def _options(*records: Option) -> dict[str, Option]:
    return {record.name: record for record in records}


OPTIONS: dict[str, Option] = _options(
    Option(
        "op",
        "The op to judge (`dcpcheck list ops`): its scenarios and its kernels. Without it, the "
        "fused op; and the plain gate (the project's kernels, every shipped scenario) judges "
        "every op.",
        kind="choice",
        choices=tuple(OPS),
        variants={
            "pytest": {
                "default": DEFAULT_OP,
                "help": f"The op the kernel implements (default {DEFAULT_OP}; as `dcpcheck "
                "run --op`).",
            }
        },
    ),
    Option(
        "dcp",
        "DCP sizes to simulate, e.g. 4 or 1,2,4,8 (default: each scenario's own). DCP1 always "
        "runs as the baseline for the cross-rank checks.",
        dest="dcp_text",
        metavar="N[,N...]",
        field="dcp_sizes",
        variants={
            "repro": {"help": "DCP sizes to simulate instead of the file's own."},
            "ranks": {
                "help": "The world size, and 1 for a DCP1 case (default: the world size).",
                "metavar": "N[,N]",
            },
            "pytest": {"help": "DCP sizes to simulate, e.g. 1,4 (default: each scenario's own)."},
        },
    ),
    Option(
        "kernel",
        "Registry name (see `dcpcheck list kernels`), package.module:function, "
        "path/to/file.py:function implementing the kernel protocol, or vllm==X.Y.Z (a "
        "published vLLM release's kernel file, fetched into the release cache).",
        dest="kernel_name",
        default="default",
        field="kernel_name",
        variants={
            "repro": {"help": "The kernel to replay it on (as for `dcpcheck run --kernel`)."},
            "pytest": {
                "default": None,
                "metavar": "SPEC",
                "help": "Kernel under test: registry name, package.module:function or "
                "path/to/file.py:function. Without it the plugin does nothing.",
            },
        },
    ),
    Option(
        "scenario",
        "Scenario names or globs (repeatable; default: all shipped scenarios).",
        dest="patterns",
        metavar="NAME|GLOB",
        multiple=True,
        variants={"pytest": {"help": "Scenario names or globs (repeatable; default: all)."}},
    ),
    Option(
        "scenario-dir",
        "Where scenario TOML files live (default: the op's shipped ones, scenarios/<op>/).",
        kind="path",
        default=None,
        variants={
            "pytest": {
                "metavar": "DIR",
                "help": "Where scenario files live (default: dcpcheck's shipped scenarios); "
                "the ini option dcpcheck_scenario_dirs adds a repository's own.",
            }
        },
    ),
    Option(
        "seed",
        "Override every scenario's value seed (explores new values). For the property search: "
        "Hypothesis's seed, so it draws other scenarios (default: a fixed seed, the same "
        "scenarios on every run).",
        kind="int",
        low=0,
        high=SEED_MAX,  # the scenario files' own limit: any seed given, a saved case replays
        field="seed",
        variants={
            "repro": {"help": "Value seed instead of the file's own (as `dcpcheck run --seed`)."},
            "ranks": {"help": "Override every scenario's value seed."},
        },
    ),
    Option(
        "examples",
        "After the named scenarios, run the property search over N drawn scenarios (default "
        "with --profile or --property-only: the profile's count).",
        kind="int",
        low=1,
        metavar="N",
        field="examples",
    ),
    Option(
        "property-only",
        "Run only the property search, no named scenarios.",
        kind="flag",
        default=False,
    ),
    Option(
        "profile",
        "Property search sizes and counts (runs the search; default ci). {profiles}.",
        dest="profile_name",
        kind="choice",
        choices=Fill("profile_names"),
        field="profile",
    ),
    Option(
        "stats",
        "Report cases / examples run, per second, and how many rank launches had an "
        "all-negative, mixed or fully-owned slot mapping.",
        kind="flag",
        default=False,
        variants={"ranks": {"help": "Report throughput and ownership shapes."}},
    ),
    Option(
        "home",
        f"Run directory (env {files.HOME_ENV}): shrunk failures go to HOME/failures/, "
        "Hypothesis's example database to HOME/hypothesis/.",
        kind="path",
        default=files.DEFAULT_HOME,
        envvar=files.HOME_ENV,
        field="home",
        variants={
            "pytest": {
                "default": None,
                "envvar": None,
                "metavar": "DIR",
                "help": "Run directory: failing cases are saved under DIR/failures/ as "
                "scenario files that `dcpcheck repro` replays (default: $DCPCHECK_HOME, else "
                ".dcpcheck; as `dcpcheck run --home`).",
            }
        },
    ),
    Option(
        "device",
        "auto: CUDA if present, else Triton's interpreter on the CPU.",
        kind="choice",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        variants={
            "ranks": {
                "help": "auto: cuda:LOCAL_RANK over NCCL if CUDA is present, else the CPU "
                "interpreter over gloo."
            },
            "pytest": {
                "kind": "text",
                "choices": (),
                "metavar": "auto|cuda|cpu",
                "help": "auto: CUDA if present, else Triton's interpreter on the CPU (default "
                "auto).",
            },
        },
    ),
    Option(
        "json",
        "Write a JSON report here (atomically).",
        dest="json_path",
        kind="path",
    ),
    Option(
        "junit",
        "Write a JUnit XML report here (atomically).",
        dest="junit_path",
        kind="path",
    ),
    Option(
        "adapter",
        "How to call an external kernel: auto picks vLLM's adapter when the function's "
        "signature is a known vLLM fused_norm_rope shape, native the harness's protocol.",
        kind="choice",
        # the fused op's adapters.ADAPTER_NAMES, spelled out: that module imports torch
        choices=("auto", "native", "vllm"),
        default="auto",
        variants={
            "pytest": {
                "help": "How to call the kernel: auto recognises vLLM's fused_norm_rope "
                "signatures (default auto)."
            }
        },
    ),
    Option(
        "no-tokens",
        "Skip the end-to-end token-stream check (a tiny MLA model's greedy streams at DCP1 and "
        "the largest --dcp size must hash identically; see `dcpcheck hash`).",
        kind="flag",
        default=False,
        variants={"pytest": {"help": "Leave out the end-to-end token-stream item."}},
    ),
    Option(
        "report-dir",
        "Write a self-contained HTML report and a PNG ownership map per case here: tokens x "
        "ranks colored by ownership, with each field's verdict.",
        kind="dir",
    ),
    Option(
        "launcher",
        "torchrun: every DCP rank is a real process on its own device (NCCL on GPUs, gloo on "
        "the CPU), results gathered to rank 0; --dcp names one size N (and 1).",
        kind="choice",
        choices=("none", "torchrun"),
        default="none",
    ),
    Option(
        "rank-timeout",
        "With --launcher torchrun: seconds without progress from any rank before the run is "
        "stopped, naming the rank(s) that hung.",
        kind="float",
        low=1.0,
        high=TIMEOUT_MAX_S,
        metavar="SECONDS",
        variants={
            "ranks": {
                "dest": "rank_timeout_s",
                "default": Fill("rank_timeout_s"),
                "metavar": None,
                "help": "Seconds the run may go without any rank making progress before it is "
                "stopped, naming the rank(s) that hung. Collectives give up "
                "{collective_margin_s:g} s later (all that ends a hang under torchrun).",
            }
        },
    ),
    Option(
        "ds-mla-scale",
        "The fp8_ds_mla tile-scale rule every fp8_ds_mla case demands: amax (max(amax/448, "
        "FLT_MIN), vLLM up to 0.30) or pow2 (a power of two, vLLM 0.31 on). Beats a "
        "scenario's ds_mla_scale key and the kernel's own declaration; default: the "
        "scenario's, else the kernel's, else amax. Other cache layouts ignore it.",
        kind="choice",
        choices=Fill("ds_mla_scales"),
        field=DEMANDS,
    ),
    Option(
        "oracle",
        "off: judge the kernel against its own DCP1 run alone, not the oracle (reference/): "
        "every real output row and owned cache entry written, outputs bitwise equal across "
        "ranks and to DCP1, shards reassembling into the DCP1 cache byte for byte, nothing "
        "written outside owned slots. The gate for a kernel whose encoding no oracle variant "
        "knows yet (a new cache-scale rule, say): it still catches DCP bugs, but not an "
        "encoding that is wrong at every DCP size alike.",
        kind="choice",
        choices=("on", "off"),
        default="on",
        field="oracle",
        variants={
            "pytest": {
                "help": "off: judge the kernel against its own DCP1 run alone, not the "
                "oracle, for a kernel whose encoding no oracle variant knows yet (default on; "
                "as `dcpcheck run --oracle`)."
            }
        },
    ),
    Option(
        "fail-fast",
        "Stop at the first failing case.",
        kind="flag",
        default=False,
        short="-x",
        field="fail_fast",
    ),
    Option(
        "isolate",
        "Run the kernel in a worker process, so that a crash (segfault, CUDA illegal memory "
        "access) or a hang fails its case (status crash / timeout) and the run goes on with a "
        "fresh worker. Default: on for kernels from outside the registry (module:function, "
        "file.py:function), off for registry kernels.",
        kind="switch",
        variants={
            "pytest": {
                "kind": "choice",
                "choices": ("on", "off"),
                "default": "on",
                "help": "on: run each item in a worker process, so a crash or a hang fails "
                "that item and the run goes on (default on; as `dcpcheck run --isolate`).",
            }
        },
    ),
    Option(
        "case-timeout",
        "Seconds to wait for each case's result before killing the worker and reporting the "
        "case as timeout (default {case_timeout_s:g}: a scenario's first case includes its "
        "DCP1 baseline and, on a GPU, Triton's compilation). Implies --isolate.",
        kind="float",
        metavar="SECONDS",
        field="case_timeout",
        variants={
            "pytest": {
                "help": "Seconds an isolated item may take before its worker is killed and the "
                "item fails as timeout (default: as `dcpcheck run --case-timeout`)."
            }
        },
    ),
    Option(
        "sanitize",
        "Run every case's kernel under NVIDIA's compute-sanitizer with this tool (CUDA only; "
        "implies --isolate): memcheck (out-of-bounds and misaligned accesses), initcheck "
        "(reads of unwritten global memory), racecheck (shared-memory races), synccheck "
        "(barrier misuse). Each report fails its case as check 'sanitizer', naming the "
        "kernel, the rank and the sanitizer's own text. Many times slower.",
        kind="choice",
        choices=Fill("sanitizer_tools"),
        field="sanitize",
    ),
    Option(
        "runs",
        "Replay it N times and say whether the verdict was the same every time: a "
        "nondeterministic kernel's failure may pass some replays (exit 1 unless all N pass).",
        kind="int",
        low=1,
        default=1,
        metavar="N",
    ),
)
"""Name -> the option."""

# fmt: off
COMMANDS: dict[str, tuple[str, ...]] = {
    "run": (
        "op", "dcp", "kernel", "scenario", "scenario-dir", "seed", "examples",
        "property-only", "profile", "stats", "home", "device", "json", "junit", "adapter",
        "no-tokens", "report-dir", "launcher", "rank-timeout", "ds-mla-scale", "oracle",
        "fail-fast", "isolate", "case-timeout", "sanitize",
    ),
    "repro": (
        "kernel", "dcp", "seed", "device", "adapter", "ds-mla-scale", "oracle", "runs",
        "json", "isolate", "case-timeout", "sanitize",
    ),
    "ranks": (
        "dcp", "scenario", "scenario-dir", "seed", "json", "junit", "no-tokens", "stats",
        "ds-mla-scale", "oracle", "fail-fast", "kernel", "adapter", "device", "rank-timeout",
    ),
    "pytest": (
        "kernel", "op", "dcp", "scenario", "scenario-dir", "device", "adapter", "no-tokens",
        "oracle", "isolate", "case-timeout", "home",
    ),
}
# fmt: on
"""Each command's options, in the order its help lists them: ``run``, ``repro``, a rank
process's ``run`` (``ranks``) and the pytest plugin (``pytest``)."""

RANK_HASH = ("kernel", "adapter", "device", "rank-timeout")
"""The options a rank process's ``hash`` shares with its ``run`` (the rest are the stream's,
``dcpcheck.cli.hashing``)."""

PASSED_TO_RANKS = tuple(name for name in COMMANDS["ranks"] if name != "rank-timeout")
"""The ``run`` options a real-rank run passes on to every rank as typed; the launcher adds
``--rank-timeout`` itself (``distributed.launcher.launch``)."""


def ops_taking(name: str, command: str = "run") -> tuple[str, ...]:
    """The ops whose ``command`` (``run`` or ``repro``) takes option ``name``."""
    return tuple(op for op, record in OPS.items() if record.takes(command, name))


def config_fields(config: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value, converted to the field's type) as the keywords of
    ``config`` (a dataclass: ``RunConfig``, ``SearchConfig``) their options set; the
    options whose field is ``DEMANDS`` as its ``(name, value)`` pairs, those given."""
    fields = {f.name for f in dataclasses.fields(config)}
    keywords = {
        OPTIONS[name].field: value
        for name, value in values.items()
        if OPTIONS[name].field in fields and OPTIONS[name].field != DEMANDS
    }
    if DEMANDS in fields:
        keywords[DEMANDS] = tuple(
            (name, value)
            for name, value in values.items()
            if OPTIONS[name].field == DEMANDS and value is not None
        )
    return keywords
