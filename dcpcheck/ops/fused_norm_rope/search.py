"""Property search: Hypothesis draws scenarios, the runner checks a kernel on each, and the
first failure is shrunk to the simplest scenario that still fails and saved as a file.

The property is the whole DCP contract: for a drawn example every ``CaseResult`` of
``runner.run_scenario`` passes. An example is up to ``BATCHED_SCENARIOS_MAX`` drawn
scenarios launched as one (``strategies.examples``,
``strategies.batched``): a case costs little more for many small scenarios than for one. A
failing or erroring case raises ``ScenarioFailed``, which carries the batched scenario;
Hypothesis shrinks the example (toward one member, then that member) and re-raises the
exception of its final replay, the minimal example, so the scenario comes straight from
that exception. A failure that needs two members to show is saved as their batched
scenario, which is one scenario file like any other.

The shrunk scenario is written as an ordinary scenario file under
``<home>/failures/`` (``home`` is ``.dcpcheck/`` in the working directory, or
``$DCPCHECK_HOME``): ``name`` equals the file stem, the description says which checks
failed on which fields, and the file loads with ``load_scenario`` and can be copied into
``scenarios/fused-norm-rope/`` as it is. It is read back and run once more before the
search returns, so a saved failure is a replayed failure (``dcpcheck repro FILE``). Drawn
scenarios name no fp8_ds_mla tile-scale rule (the run's option or the kernel's declaration
decides it, ``runner.effective_ds_mla_scale``); the saved file names the rule it failed
under, so a replay with another kernel or without the option still runs that rule.

Reproducibility: without an explicit seed Hypothesis runs from ``DEFAULT_SEED``, so the
same kernel and options draw the same scenarios on every machine (CI), and ``seed``
explores others. Hypothesis's ``derandomize=True`` would do the former but forbids an
example database, and ``hypothesis.seed`` clears it; the settings below are applied
*after* ``seed`` to put the database back. So a run is seeded *and* a re-run replays the
last failure first, from ``<home>/hypothesis/<kernel>/`` (an empty home, as in CI, has
nothing to replay).

Everything Hypothesis writes goes under ``<home>/hypothesis/``: while a search runs that is
Hypothesis's storage directory too (:func:`hypothesis_storage`), where it caches what else
it keeps (``constants/``: literals it mines from the modules under test to draw from);
otherwise that would be ``.hypothesis/`` in the directory Python started in.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dcpcheck import files
from dcpcheck.backend import Backend
from dcpcheck.cases.seeded_draws import seed_alone
from dcpcheck.cases.verdicts import CaseResult, RunConfig, ownership_totals
from dcpcheck.device_faults import raised_as_itself, unshrunk
from dcpcheck.ops.fused_norm_rope.contract import PRESETS, SMALL_PRESETS, Kernel
from dcpcheck.ops.fused_norm_rope.runner import run_scenario, with_effective_ds_mla_scale
from dcpcheck.ops.fused_norm_rope.scenario import Scenario, load_scenario, scenario_to_toml

if TYPE_CHECKING:
    from dcpcheck.ops.fused_norm_rope import strategies

DEFAULT_SEED = 0
"""Hypothesis seed of a run without ``--seed``: every such run draws the same scenarios."""

BATCHED_SCENARIOS_MAX = 32
"""Scenarios one example may launch together (``strategies.examples``), every profile: a
case's cost is mostly per launch and per check pass, not per token (about 1,500 small GPU
kernels for under half a millisecond of GPU work; the interpreter pays per program), so
many small scenarios cost little more than one: on 2 CPU cores, the ci profile's 100
examples of 1,760 scenarios took 2.3x the time of 100 single scenarios
(``benchmarks/gate_wall_time.py``).
Every member is as large as a scenario of the profile alone, and an example shrinks
toward one scenario."""

REPLAY_RUNS_FLAKY = 10
"""How many runs the replay of a flaky or nondeterministic failure asks for (``dcpcheck
repro --runs``): a kernel that fails one call in ten shows it in most ten-run replays."""


@dataclass(frozen=True)
class Profile:
    """How much a property search tries: examples, batch sizes, presets.

    Counts and sizes are chosen for the time each profile may take with the default kernel:
    on the CPU, Triton's interpreter runs a small case in ~0.05-0.2 s per rank launch.
    """

    name: str
    examples: int
    max_tokens: int  # rows per scenario, padding included
    max_requests: int  # per scenario
    cpu_presets: tuple[str, ...]  # under Triton's interpreter
    gpu_presets: tuple[str, ...]
    description: str

    def space(self, backend: Backend, dcp_sizes: tuple[int, ...] | None) -> strategies.SearchSpace:
        # Imported here: Hypothesis (under the strategies) is for the search alone, and a
        # run without one does not pay its import.
        from dcpcheck.ops.fused_norm_rope import strategies

        presets = self.cpu_presets if backend.interpreted else self.gpu_presets
        return strategies.SearchSpace(
            presets, self.max_tokens, self.max_requests, dcp_sizes, BATCHED_SCENARIOS_MAX
        )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "smoke",
            20,
            4,
            2,
            SMALL_PRESETS,
            SMALL_PRESETS,
            "20 examples, <= 4 rows, <= 2 requests per scenario, small presets: a few seconds "
            "on the CPU",
        ),
        Profile(
            "ci",
            100,
            8,
            3,
            SMALL_PRESETS,
            SMALL_PRESETS,
            "100 examples, <= 8 rows, <= 3 requests per scenario, small presets: about a "
            "minute on 2 CPU cores",
        ),
        Profile(
            "thorough",
            1000,
            32,
            4,
            SMALL_PRESETS,
            tuple(PRESETS),
            "1000 examples, <= 32 rows, <= 4 requests per scenario; the real DeepSeek-V3.2 / "
            "GLM-5 presets too on a GPU (small ones only on the CPU)",
        ),
    )
}


@dataclass(frozen=True)
class SearchConfig:
    """What one property search is asked to do."""

    kernel_name: str
    profile: Profile = PROFILES["ci"]
    examples: int | None = None  # None: the profile's count
    dcp_sizes: tuple[int, ...] | None = None  # None: drawn per scenario (1..8)
    seed: int | None = None  # None: DEFAULT_SEED (reproducible); else explore with this seed
    home: Path = field(default_factory=files.default_home)
    demands: tuple[tuple[str, str], ...] = ()  # --ds-mla-scale as typed (RunConfig.demands)
    oracle: bool = True  # --oracle off: each example judged against its own DCP1 run alone

    @property
    def max_examples(self) -> int:
        return self.profile.examples if self.examples is None else self.examples

    @property
    def profile_name(self) -> str:
        return self.profile.name

    @property
    def seed_used(self) -> int:
        return DEFAULT_SEED if self.seed is None else self.seed

    @property
    def failures_dir(self) -> Path:
        return self.home / files.FAILURES_DIR

    @property
    def hypothesis_dir(self) -> Path:
        return self.home / files.HYPOTHESIS_DIR

    @property
    def database_dir(self) -> Path:
        return self.hypothesis_dir / files.kernel_slug(self.kernel_name)


@dataclass
class SearchResult:
    """What a search did and, if the kernel failed, the shrunk failure and its replay."""

    examples_run: int  # property calls: generated, replayed and shrinking examples alike
    scenarios_run: int  # the scenarios those examples launched (strategies.examples)
    seconds: float
    examples_to_first_failure: int | None  # None: no example failed
    ownership: dict[str, int]  # rank launches by slot-mapping shape, over all examples
    shrunk: Scenario | None = None  # the minimal failing scenario, as saved (source set)
    saved_path: Path | None = None
    failed_checks: tuple[str, ...] = ()  # checks the shrunk scenario fails ("error" if raised)
    replay: list[CaseResult] = field(default_factory=list)  # the saved file, run again
    replay_command: str = ""  # how to run the saved file again, from where the search ran

    @property
    def passed(self) -> bool:
        return self.shrunk is None

    @property
    def shrunk_summary(self) -> str:
        """The shrunk failure's requests, tokens, padding and DCP sizes ("" if it passed)."""
        if self.shrunk is None:
            return ""
        batch = self.shrunk.batch
        return (
            f"{len(batch.requests)} request(s), {batch.num_real_tokens} token(s) + "
            f"{batch.padding} padding, DCP {', '.join(map(str, self.shrunk.dcp_sizes))}"
        )

    @property
    def examples_per_second(self) -> float:
        return self.examples_run / self.seconds if self.seconds > 0 else 0.0

    @property
    def scenarios_per_second(self) -> float:
        return self.scenarios_run / self.seconds if self.seconds > 0 else 0.0


class ScenarioFailed(AssertionError):
    """The property's failure: ``scenario`` has a failing or erroring case in ``results``."""

    def __init__(self, scenario: Scenario, results: list[CaseResult]) -> None:
        super().__init__(f"{scenario.name}: {', '.join(failure_summary(results))}")
        self.scenario = scenario
        self.results = results


def failure_summary(results: list[CaseResult]) -> list[str]:
    """One phrase per failing case: checks with the fields they failed on, or the error."""
    phrases = []
    for r in results:
        if r.status == "error":
            phrases.append(f"DCP{r.dcp_size}: the kernel raised ({r.error})")
        elif r.status in ("fail", "nondeterministic"):
            checks = []
            for c in r.failed_checks:
                fields = ", ".join(dict.fromkeys(f.field for f in c.findings))
                first = c.findings[0]
                where = f"rank {first.rank}" if first.rank is not None else "all ranks"
                token = (
                    f", token {first.token} {first.ownership}" if first.token is not None else ""
                )
                checks.append(f"{c.check} on {fields} (first: {where}{token})")
            phrases.append(f"DCP{r.dcp_size}: " + "; ".join(checks))
    return phrases


def failed_check_names(results: list[CaseResult]) -> tuple[str, ...]:
    names = [c.check for r in results for c in r.failed_checks]
    names += ["error"] * any(r.status == "error" for r in results)
    return tuple(dict.fromkeys(names))


@contextlib.contextmanager
def hypothesis_storage(directory: Path) -> Iterator[None]:
    """Hypothesis's storage directory is ``directory`` inside the ``with``, and what it was
    after. Its default is fixed when Hypothesis is imported (``.hypothesis`` in the working
    directory of that moment) and ``HYPOTHESIS_STORAGE_DIRECTORY`` is read once, so only
    ``set_hypothesis_home_dir`` moves it for one search."""
    from hypothesis import configuration  # imported by a search alone (``Profile.space``)

    before = configuration.storage_directory(intent_to_write=False).home_directory
    configuration.set_hypothesis_home_dir(directory)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(before)


def search(
    kernel: Kernel,
    config: SearchConfig,
    backend: Backend,
    on_example: Callable[[int], None] | None = None,
) -> SearchResult:
    """Run the property over ``config.max_examples`` drawn scenarios (plus replays and
    shrinking); ``on_example`` sees the running count (progress)."""
    # Imported here, as in ``Profile.space``: a run without a search does not pay for them.
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.errors import Flaky

    from dcpcheck.ops.fused_norm_rope import strategies

    space = config.profile.space(backend, config.dcp_sizes)
    # Each scenario's own sizes and seed; the options' tile-scale rule (if given) and oracle.
    run_config = RunConfig(config.kernel_name, None, demands=config.demands, oracle=config.oracle)
    ownership = ownership_totals([])
    examples_run = scenarios_run = 0
    first_failure: int | None = None
    last_failure: ScenarioFailed | None = None

    def contract_holds(members: tuple[Scenario, ...]) -> None:
        nonlocal examples_run, scenarios_run, first_failure, last_failure
        examples_run += 1
        scenarios_run += len(members)
        scenario = strategies.batched(members)
        results = list(run_scenario(kernel, scenario, run_config, backend))
        for shape, count in ownership_totals(results).items():
            ownership[shape] += count
        if on_example is not None:
            on_example(examples_run)
        if any(r.failed for r in results):
            first_failure = first_failure or examples_run
            last_failure = ScenarioFailed(scenario, results)
            raise last_failure

    hypothesis_settings = settings(
        max_examples=config.max_examples,
        deadline=None,  # kernel time varies with the interpreter, the GPU's warm-up
        database=DirectoryBasedExampleDatabase(config.database_dir),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        report_multiple_bugs=False,  # one shrunk failure, the one saved
        verbosity=Verbosity.quiet,  # the result is reported by the caller
        print_blob=False,
    )
    hypothesis_seed = DEFAULT_SEED if config.seed is None else config.seed
    # seed() clears the database; the settings applied after it put it back (docstring).
    test = hypothesis_settings(
        seed(hypothesis_seed)(given(strategies.examples(space))(unshrunk(contract_holds)))
    )

    start = time.perf_counter()
    try:
        with hypothesis_storage(config.hypothesis_dir), seed_alone(), raised_as_itself():
            test()
    except ScenarioFailed as failure:
        shrunk, failing, flaky = failure.scenario, failure.results, False
    except Flaky:
        # A failing example passed when Hypothesis replayed it: the kernel's verdict on one
        # input is not stable. Keep the last failure as it was seen (not shrunk: shrinking
        # needs a failure that repeats) and say so; never Hypothesis's traceback.
        assert last_failure is not None, "Hypothesis reported a flaky test that never failed"
        shrunk, failing, flaky = last_failure.scenario, last_failure.results, True
    else:
        seconds = time.perf_counter() - start
        return SearchResult(examples_run, scenarios_run, seconds, None, ownership)
    seconds = time.perf_counter() - start

    # A failure that did not repeat, or whose runs differed, replays several times: one
    # replay of a nondeterministic kernel passes more often than not.
    unstable = flaky or any(r.status == "nondeterministic" for r in failing)
    runs = f" --runs {REPLAY_RUNS_FLAKY}" if unstable else ""
    how = (
        "Found by dcpcheck's property search and not shrunk, because it passed when "
        "replayed (the kernel is not deterministic)"
        if flaky
        else "Found and shrunk by dcpcheck's property search"
    )
    description = (
        f"{how}: kernel {config.kernel_name} fails "
        f"{' | '.join(failure_summary(failing))}. Replay: dcpcheck repro <this file>"
        f"{runs}{run_config.kernel_options}"
    )
    stem = f"{'flaky' if flaky else 'shrunk'}-{files.kernel_slug(config.kernel_name)}"
    shrunk = with_effective_ds_mla_scale(shrunk, run_config, kernel)  # the rule it failed under
    path = files.save_failure(shrunk, stem, description, config.failures_dir, scenario_to_toml)
    saved = load_scenario(path)
    replay = list(run_scenario(kernel, saved, run_config, backend))
    return SearchResult(
        examples_run,
        scenarios_run,
        seconds,
        first_failure,
        ownership,
        shrunk=saved,
        saved_path=path,
        failed_checks=failed_check_names(failing) + (("flaky",) if flaky else ()),
        replay=replay,
        replay_command=f"dcpcheck repro {shlex.quote(str(path))}{runs}{run_config.kernel_options}",
    )
