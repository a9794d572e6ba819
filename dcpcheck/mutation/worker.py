"""``python -m dcpcheck.mutation.worker ORIGINAL MUTANT ARGS...``: ``python -m dcpcheck
ARGS`` with the file at ``MUTANT`` loaded wherever ``ORIGINAL`` would be
(``dcpcheck.kernels.substitution``). ``dcpcheck mutate`` runs each mutant's gate so, in a
process of its own: the command line is the gate's, unchanged."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from dcpcheck.kernels.substitution import substitute

if __name__ == "__main__":
    original, mutant, *arguments = sys.argv[1:]
    substitute(Path(original), Path(mutant))
    sys.argv = ["dcpcheck", *arguments]
    runpy.run_module("dcpcheck", run_name="__main__", alter_sys=True)
