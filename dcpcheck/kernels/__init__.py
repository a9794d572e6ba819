"""The project's kernel under test and how any ``--kernel`` is loaded.

``variants`` names every build of the one Triton kernel (the correct one, the historical
regressions, the mutants); ``fused_norm_rope`` is that Triton kernel, ``launcher`` its
host side (tiles, grid, the launch; ``fp8_codes`` and ``launch_checks`` are its helpers);
``registry`` serves each build by name; ``loading`` loads any ``--kernel`` (a registry
name, ``module:function``, ``file.py:function`` or a vLLM release from ``releases``).
"""
