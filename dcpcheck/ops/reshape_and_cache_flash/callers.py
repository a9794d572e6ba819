"""How each release's callers call ``triton_reshape_and_cache_flash``: the cache layouts
they hand it, and whether the backend they sit in runs under DCP. Read from the releases'
wheels (``vllm/*.py``); lines are the first release's of a group unless one is named.

Callers, by the op's layout names (``dcpcheck.ops.reshape_and_cache_flash.case``):

* ``vllm/v1/attention/backends/triton_attn.py`` (every release): ``kv_cache.unbind(1)`` of a
  ``[blocks, 2, block_size, kv_heads, head_size]`` cache up to 0.25.1 (``nhd``; from 0.20.0
  its stride order may put the heads before the block's tokens, a head stride of its own:
  ``hnd``), ``kv_cache.transpose(1, 2).split(head_size, -1)`` of a ``[blocks, kv_heads,
  block_size, 2 * head_size]`` cache from 0.26.0 (``hnd``); fp8 caches viewed as the
  platform's fp8 dtype before the call.
* ``vllm/v1/attention/backends/rocm_attn.py`` (0.14.0 on): ``PagedAttention.split_kv_cache``,
  the 5-D key and 4-D value (``head-major``), handed as allocated (uint8 for an fp8 cache;
  the function views it), for the block sizes its HIP write does not take.
* ``vllm/v1/attention/backends/rocm_segmented_attn.py`` (0.32.0 on):
  ``kv_cache[:, i].unflatten(-1, (kv_heads, head_size))`` (``nhd``).
* ``vllm/models/minimax_m3/amd/model.py`` (0.34.0): ``transpose(1, 2).split`` as the Triton
  backend's (``hnd``).

None of these backends runs under DCP: their impls keep ``can_return_lse_for_decode``
False, and the start-up check asserts it for every attention layer when the decode
context parallel size is above 1 (``DCP_REFUSED``); from 0.30.0 the backend selector also
refuses a backend whose impl keeps ``supports_dcp`` False.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcpcheck.kernels.releases import version_key


@dataclass(frozen=True)
class CallerGroup:
    """Releases ``first`` - ``last``, whose callers hand the function the same layouts."""

    first: str
    last: str
    passed: dict[str, str]
    """Each layout some caller passes: the line that shows it."""
    never: str
    """What the callers pass instead of any other layout: the line that shows it."""

    def holds(self, version: str) -> bool:
        return version_key(self.first) <= version_key(version) <= version_key(self.last)


TRITON = "vllm/v1/attention/backends/triton_attn.py"
ROCM = "vllm/v1/attention/backends/rocm_attn.py"

GROUPS = (
    CallerGroup(
        "0.11.0",
        "0.13.0",
        {"nhd": f"{TRITON}:292 (0.11.0; kv_cache.unbind(1), the only caller)"},
        f"{TRITON}:178 (0.11.0): the cache is (num_blocks, 2, block_size, num_kv_heads, "
        "head_size) with no stride order of its own, heads contiguous; no 5-D caller",
    ),
    CallerGroup(
        "0.14.0",
        "0.19.1",
        {
            "nhd": f"{TRITON}:470 (0.14.0; kv_cache.unbind(1))",
            "head-major": f"{ROCM}:358 (0.14.0; PagedAttention.split_kv_cache)",
        },
        f"{TRITON}:302 (0.14.0): the stride order is (0, 1, 2, 3, 4) whatever the cache "
        "layout, heads contiguous",
    ),
    CallerGroup(
        "0.20.0",
        "0.25.1",
        {
            "nhd": f"{TRITON}:725 (0.20.0; kv_cache.unbind(1))",
            "hnd": f"{TRITON}:347 (0.20.0; stride order (0, 1, 3, 2, 4) for an HND cache layout)",
            "head-major": f"{ROCM}:487 (0.20.0; PagedAttention.split_kv_cache)",
        },
        "",
    ),
    CallerGroup(
        "0.26.0",
        "0.31.0",
        {
            "hnd": f"{TRITON}:821 (0.26.0; kv_cache.transpose(1, 2).split)",
            "head-major": f"{ROCM}:508 (0.26.0; PagedAttention.split_kv_cache)",
        },
        f"{TRITON}:821 (0.26.0): K and V are the halves of a [blocks, kv_heads, block_size, "
        "2 * head_size] cache's last axis, a head stride of 2 * head_size or more; "
        "no caller passes a cache whose heads are contiguous",
    ),
    CallerGroup(
        "0.32.0",
        "0.34.0",
        {
            "nhd": "vllm/v1/attention/backends/rocm_segmented_attn.py:323 (0.32.0; "
            "kv_cache[:, 0].unflatten(-1, (num_kv_heads, head_size)))",
            "hnd": f"{TRITON}:800 (0.32.0; kv_cache.transpose(1, 2).split)",
            "head-major": f"{ROCM}:495 (0.32.0; PagedAttention.split_kv_cache)",
        },
        "",
    ),
)

_CP_UTILS = "vllm/v1/worker/cp_utils.py"
_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_SELECTOR = "vllm/v1/attention/backend.py"

DCP_REFUSED: dict[str, str] = {
    "0.11.0": f"{_RUNNER}:4007",
    "0.11.1": f"{_RUNNER}:5021",
    "0.11.2": f"{_RUNNER}:5025",
    "0.12.0": f"{_RUNNER}:5282",
    "0.13.0": f"{_CP_UTILS}:30",
    "0.14.0": f"{_CP_UTILS}:30",
    "0.14.1": f"{_CP_UTILS}:30",
    **dict.fromkeys(
        [
            "0.15.0",
            "0.15.1",
            "0.16.0",
            "0.17.0",
            "0.17.1",
            "0.18.0",
            "0.18.1",
            "0.19.0",
            "0.19.1",
            "0.20.0",
            "0.20.1",
            "0.20.2",
            "0.21.0",
            "0.22.0",
            "0.22.1",
            "0.23.0",
            "0.24.0",
            "0.25.0",
            "0.25.1",
        ],
        f"{_CP_UTILS}:31",
    ),
    **dict.fromkeys(["0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0"], f"{_CP_UTILS}:46"),
    "0.30.0": f"{_CP_UTILS}:49, {_SELECTOR}:341",
    "0.31.0": f"{_CP_UTILS}:51, {_SELECTOR}:345",
    "0.32.0": f"{_CP_UTILS}:51, {_SELECTOR}:343",
    "0.33.0": f"{_CP_UTILS}:51, {_SELECTOR}:346",
    "0.34.0": f"{_CP_UTILS}:51, {_SELECTOR}:349",
}
"""The line that refuses a decode context parallel size above 1 to every backend that
calls the function, per release (module docstring)."""


def group_of(version: str) -> CallerGroup | None:
    """The caller group of ``version``, or None for a release outside every group."""
    return next((group for group in GROUPS if group.holds(version)), None)
