"""Stand-in for the ``vllm`` package while a vLLM kernel file is loaded without vLLM.

Only the modules that vLLM's fused MLA kernel file (``vllm/models/deepseek_v32/common/
kernels.py``) imports at module level, in releases 0.28.0 to 0.33.0 and in the git
history before them, exist here; :data:`dcpcheck.adapters.shims.STAND_INS` maps each host module
to its stand-in. See :mod:`dcpcheck.adapters.shims` for when they are installed.
"""
