"""The fused op: MLA's RMSNorm + RoPE + cache write, vLLM's ``fused_norm_rope``
(docs/fused-norm-rope.md).

Its contract (``contract``: every buffer, layout and format) and scenario keys
(``scenario``, ``cost``); the project's Triton kernel (``kernel`` with its host side
``launcher`` and ``launch_checks``, the entry encodings ``fp8_codes``, ``index_cache`` and
``nvfp4_ds_mla``) and its builds (``variants``: the correct one and the selftest's
mutants); any ``--kernel`` of the op (``kernels``), through an adapter (``adapters``,
``vllm``: every API shape vLLM's kernel has had); one case's buffers (``case``,
``value_regimes``), its checks (``checks``, ``entry_checks``, ``cache_entries``,
``comparison``, ``stray_writes``, ``input_snapshot``, ``tolerances``,
``tolerance_kernel``, ``fused_checks``, ``determinism``, ``limitations``, in the order
``case_checks`` runs them) and the runner that judges cases (``runner``,
``compile_ahead``); the property search (``strategies``, ``search``) and the selftest
(``selftest``).
"""
