"""Ops dcpcheck judges besides the fused MLA norm + RoPE + cache write, one package each,
holding what is the op's own: its kernel protocol, its cases, its contract checks, the
project's kernel for it and that kernel's mutants. The oracle of each lives in
``reference/`` (torch only)."""
