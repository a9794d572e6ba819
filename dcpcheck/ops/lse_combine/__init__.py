"""The lse-combine op: the merge of the DCP ranks' partial attentions by their
log-sum-exps into what one rank attending over the whole context computes. ``contract``
holds its protocol, ``collectives`` a DCP group simulated in one process (and one over
torch.distributed, which ``real_ranks`` runs a process per rank with), ``case`` a batch of
decode rows and every rank's partials, ``checks`` its contract and tolerances, ``chain``
the merge of partials from a real decode attention (``attention``, the project's), ``kernel``
the project's merge (a Triton correction), ``mutants`` it with one bug each, ``vllm`` the
released merges; ``reference.lse_combine`` is its oracle. ``PACKAGE`` is what the command
line asks of it.
"""

from __future__ import annotations

from typing import Any

from dcpcheck.op_registry import LSE_COMBINE
from dcpcheck.ops import OpPackage
from dcpcheck.ops.lse_combine import cost, scenario


def _kernels():  # defines Triton kernels: only once the backend is chosen
    from dcpcheck.ops.lse_combine import kernels

    return kernels


def _runner():
    from dcpcheck.ops.lse_combine import runner

    return runner


def _search():
    from dcpcheck.ops.lse_combine import search

    return search


def _run_on_real_ranks(*args: Any) -> Any:
    from dcpcheck.ops.lse_combine import real_ranks

    return real_ranks.run_on_real_ranks(*args)


def _selftest(backend: Any, on_row: Any = None) -> Any:
    from dcpcheck.ops.lse_combine import selftest

    return selftest.run_selftest(backend, on_row)


PACKAGE = OpPackage(
    name=LSE_COMBINE,
    scenarios=scenario.SCENARIOS,
    load_scenarios=scenario.load_scenarios,
    load_scenario=scenario.load_scenario,
    kernel=lambda spec: _kernels().load(spec),
    judged_files=lambda spec: _kernels().judged_files(spec),
    canonical=lambda spec: _kernels().canonical(spec),
    kernels=lambda: dict(_kernels().DESCRIPTIONS),
    run_scenario=lambda *args: _runner().run_scenario(*args),
    save_failed_case=lambda *args: _runner().save_failed_case(*args),
    search=lambda *args: _search().search(*args),
    save_search=lambda *args: _search().save_outcome(*args),
    selftest=_selftest,
    check_cost=cost.check_cost,
    run_on_real_ranks=_run_on_real_ranks,
)
