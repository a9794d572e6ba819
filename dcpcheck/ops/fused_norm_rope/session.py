"""The fused op's :class:`~dcpcheck.ops.session_cases.SessionCases`: how
``dcpcheck.workflows.session``, the isolation worker, the command line and the reports
judge its cases, run its search and read what a kernel of it declares."""

from __future__ import annotations

from collections.abc import Mapping

from dcpcheck.ops.fused_norm_rope import search
from dcpcheck.ops.fused_norm_rope.compile_ahead import compile_ahead
from dcpcheck.ops.fused_norm_rope.rank_cases import scenario_on_ranks
from dcpcheck.ops.fused_norm_rope.runner import (
    LAUNCH_WATCHER,
    declared_ds_mla_scale,
    run,
    run_scenario,
    with_effective_ds_mla_scale,
)
from dcpcheck.ops.session_cases import SessionCases


def declarations(kernel: object) -> Mapping[str, object]:
    """The fp8_ds_mla tile-scale rule ``kernel`` declares (``runner.declared_ds_mla_scale``),
    under the attribute the runner reads it from."""
    return {"ds_mla_scale": declared_ds_mla_scale(kernel)}


SESSION_CASES = SessionCases(
    run=run,
    run_scenario=run_scenario,
    compile_ahead=compile_ahead,
    as_run=with_effective_ds_mla_scale,
    declarations=declarations,
    launch_watcher=LAUNCH_WATCHER,
    search_config=search.SearchConfig,
    search=search.search,
    failure_summary=search.failure_summary,
    scenario_on_ranks=scenario_on_ranks,
)
