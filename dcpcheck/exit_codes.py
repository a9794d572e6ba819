"""Exit codes of every dcpcheck command: part of the interface (CI gates on 1, ``git
bisect run`` skips a commit on 125)."""

EXIT_OK = 0
"""Every check that could run passed; a case not applicable on this machine fails nothing."""

EXIT_FAIL = 1
"""A check failed, or the kernel raised while running a case."""

EXIT_USAGE = 2
"""Usage error or bad input, found before any work starts; a ``--kernel`` wrong in itself
too (``dcpcheck.kernels.loading.KernelSpecError``: a name the registry does not know, a
``file.py`` without ``:function``, a release version that is no version or not published,
a release cache whose file differs from dcpcheck's lock file or its wheel's RECORD, in
every command and op that reads it: ``dcpcheck.kernels.releases.CacheFault``), which no
revision would load: an error to fix, not a revision to skip (``dcpcheck bisect`` stops on
it; ``git bisect run``, like for any code in 1-127 but 125, takes the revision as bad)."""

EXIT_PEER_LOST = 3
"""One rank of a real-rank run (dcpcheck.distributed), when a collective failed because
another rank died or stopped: the launcher then looks for that other rank instead of naming
this one. Never the exit code of the run itself."""

EXIT_KERNEL_LOAD = 125
"""The kernel under test could not be loaded or compiled at this revision: its file or
module is missing, does not import, lacks the function or fits no adapter
(``dcpcheck.kernels.loading.KernelLoadError``)."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, the shell's code), after writing partial reports."""

EXIT_TERMINATED = 143
"""SIGTERM (128 + 15: a CI job's timeout, ``kill``), after writing partial reports."""
