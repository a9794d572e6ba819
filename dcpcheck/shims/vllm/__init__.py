"""Stand-in for the ``vllm`` package while a vLLM kernel file is loaded without vLLM.

Only the two modules vLLM's fused MLA kernel file imports at module level exist here
(``vllm/models/deepseek_v32/common/kernels.py`` at 01b9c661 imports exactly
``from vllm.platforms import current_platform`` and ``from vllm.triton_utils import tl,
triton``). See :mod:`dcpcheck.shims` for when it is installed.
"""
