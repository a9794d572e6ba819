"""Ops dcpcheck judges besides the fused MLA norm + RoPE + cache write, one package each,
holding what is the op's own: its kernel protocol and buffers, and the project's kernel
for it. The oracle of each lives in ``reference/`` (torch only)."""
