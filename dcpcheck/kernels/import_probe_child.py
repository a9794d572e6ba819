"""The child side of ``dcpcheck.kernels.import_probe`` (which starts it and says why):
import one kernel module, on the backend its parent chose, then say so on a pipe.

It runs as ``python -m dcpcheck.kernels.import_probe_child WHERE FD``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from dcpcheck.backend import select_backend
from dcpcheck.kernels import loading
from dcpcheck.kernels.import_probe import IMPORTED


def main(argv: list[str]) -> None:
    """Import ``WHERE`` (``loading.module_of``), then write ``IMPORTED`` on ``FD``."""
    where, fd = argv[0], int(argv[1])
    # Triton fixes compiled or interpreted as a kernel is defined: as the parent chose.
    select_backend("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "auto")
    # The parent imports the module next and warns of what it stands in for itself.
    logging.getLogger(loading.__name__).setLevel(logging.ERROR)
    with contextlib.suppress(loading.KernelLoadError):  # the parent raises it again
        loading.module_of(where)
    os.write(fd, IMPORTED)
    os._exit(0)  # the import is all it was for: no interpreter teardown


if __name__ == "__main__":
    main(sys.argv[1:])
