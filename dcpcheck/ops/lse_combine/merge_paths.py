"""The merges a release's MLA attention layer may run under DCP, and the one it runs by
default, as read in each release's source.

vLLM's ``ParallelConfig.dcp_comm_backend`` picks the merge of the ranks' partial decode
attentions: ``"ag_rs"`` runs ``cp_lse_ag_out_rs`` (an all-gather of the LSEs, a
correction, a reduce-scatter by heads), ``"a2a"`` runs ``dcp_a2a_lse_reduce`` (an
all-to-all of the partials and their LSEs, then a merge of each rank's heads).

* Before 0.18.0 there is no such option: the MLA layer calls ``cp_lse_ag_out_rs`` alone.
* From 0.18.0 the option exists, ``"ag_rs"`` by default (``vllm/config/parallel.py``'s
  ``dcp_comm_backend: DCPCommBackend = "ag_rs"`` to 0.28.0; from 0.29.0 ``None``, which
  ``set_dcp_defaults`` fills with ``"ag_rs"`` unless the model's config hook asked for
  another: GLM-MoE-DSA asks for ``"a2a"`` from 0.29.0, Mistral Large 4 from 0.34.0, the
  DeepSeek models the tiny model stands for never do), and the MLA layer calls
  ``dcp_a2a_lse_reduce`` when it is ``"a2a"``: in
  ``vllm/model_executor/layers/attention/mla_attention.py`` to 0.27.1, from 0.28.0 through
  its ``MLADCPManager`` (``vllm/v1/attention/ops/dcp_utils.py``). From 0.28.0 that manager
  runs, on CUDA within one node, a compiled symmetric-memory kernel in the Triton
  merge's place unless ``VLLM_USE_DIRECT_DCP_A2A=0``; the chain judges the Triton one,
  which runs otherwise.

README ("vLLM's merges, release by release") has the file and line of each release.
"""

from __future__ import annotations

from dcpcheck.kernels import releases

AG_RS, A2A = "ag_rs", "a2a"
"""vLLM's names of the two merges (``dcp_comm_backend``)."""

FUNCTIONS = {AG_RS: "cp_lse_ag_out_rs", A2A: "dcp_a2a_lse_reduce"}
"""The routine each merge path runs."""

DEFAULT = AG_RS
"""The path every release runs for the DeepSeek models unless told otherwise."""

A2A_FROM = "0.18.0"
"""The first release whose MLA layer can run the all-to-all merge."""


def offered(version: str) -> tuple[str, ...]:
    """The merge paths release ``version``'s MLA layer offers, its default first."""
    paths = (
        (AG_RS, A2A)
        if releases.version_key(version) >= releases.version_key(A2A_FROM)
        else (AG_RS,)
    )
    return (DEFAULT, *(path for path in paths if path != DEFAULT))


def spec_of(version: str, path: str) -> str:
    """The ``lse-combine`` spec of release ``version``'s merge on ``path``."""
    name = f"vllm=={version}"
    return name if path == AG_RS else f"{name}:{FUNCTIONS[path]}"
