"""``dcpcheck.cases.seeded_draws``: inside a seeded search Hypothesis draws from the seed
and the strategy alone, not from constants of whatever project modules the process has
loaded, so a search draws the same examples in a test worker and in ``dcpcheck run``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dcpcheck.cases.seeded_draws import seed_alone

providers = pytest.importorskip("hypothesis.internal.conjecture.providers")


def test_inside_seed_alone_the_pool_of_the_loaded_modules_constants_is_empty():
    if not hasattr(providers, "_get_local_constants"):
        pytest.skip("this Hypothesis draws no constants of the loaded modules")
    loaded = len(providers._get_local_constants())
    assert loaded > 0  # dcpcheck's own modules are local: their constants are in the pool
    with seed_alone():
        assert len(providers._get_local_constants()) == 0
    assert len(providers._get_local_constants()) == loaded


SEARCH = """
import sys, tempfile
from pathlib import Path
from dcpcheck.backend import select_backend
backend = select_backend("cpu")
if sys.argv[1] == "more":  # modules whose constants Hypothesis would otherwise mix in
    import dcpcheck.mutation.runner, dcpcheck.ops.lse_combine.vllm_state_merge
    import dcpcheck.ops.sparse_topk_remap.vllm, tests.test_sparse_topk_remap
from dcpcheck.ops.fused_norm_rope import search
from tests.fixtures.declared_encoding import oracle_writing_pow2
home = Path(tempfile.mkdtemp())
config = search.SearchConfig("w", search.PROFILES["smoke"], examples=40, home=home)
found = search.search(oracle_writing_pow2, config, backend)
print(found.examples_run, found.scenarios_run, found.ownership)
"""


def test_a_seeded_search_draws_the_same_whatever_else_the_process_imported():
    drawn = [
        subprocess.run(
            [sys.executable, "-c", SEARCH, loaded], capture_output=True, text=True, check=True
        ).stdout
        for loaded in ("few", "more")
    ]
    assert drawn[0] and drawn[0] == drawn[1]
