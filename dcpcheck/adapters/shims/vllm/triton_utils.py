"""Stand-in for ``vllm.triton_utils``: the real ``triton`` and ``triton.language``.

vLLM re-exports Triton through this module so that it can substitute placeholders where
Triton is missing; the harness always has Triton, so the re-export is the whole module.
Imported only after ``dcpcheck.backend`` has fixed ``TRITON_INTERPRET``.
"""

import triton
import triton.language as tl

HAS_TRITON = True

__all__ = ["HAS_TRITON", "tl", "triton"]
