"""Exit codes of every dcpcheck command: part of the interface (CI gates on 1, ``git
bisect run`` skips a commit on 125).

Exit 0 means that cases ran and passed. A command that judged no case is never 0,
whatever the reason, and says so on a line of its own; its reports are still written,
marked (a run's hold the record ``dcpcheck-kernel-load`` in place of its cases, or its
``not_applicable`` cases), so no earlier run's report is left to be read as this one's.
Why no case was judged decides the code, by who could change the answer:

* the kernel raised while it loaded, ``sys.exit`` in its module included: it does not
  load at this revision (125, :data:`EXIT_KERNEL_LOAD`);
* its import ended the process importing it (``os._exit``, a signal) or outlived
  ``--case-timeout``: that is the kernel's own crash or hang, as in a launch (1,
  :data:`EXIT_FAIL`; ``dcpcheck.kernels.import_probe``);
* every case asked was not applicable here, so nothing was launched: no check could call
  the revision good or bad (125);
* a ``mutate`` run whose mutants were all explained or did not compile, a ``selftest``
  whose chosen mutants cannot show on this machine: the question asked has no answer
  here (1, and 2 where that is known before any work).
"""

EXIT_OK = 0
"""Cases ran, and every check that could run passed; a case not applicable on this machine
fails nothing, but a run of only such cases judged nothing and is not 0."""

EXIT_FAIL = 1
"""A check failed, or the kernel raised while running a case, crashed or timed out, or the
device faulted mid-run (``dcpcheck.workflows.session.DEVICE_FAULT_CASE``); its
module's import too, where it ended or hung the process importing it
(``dcpcheck.kernels.import_probe.KernelImportLost``): like a crash in a launch, it is what
the kernel under test did, so ``git bisect run`` takes that revision as bad."""

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
"""The kernel under test could not be judged at this revision: its file or module is
missing, does not import (it raises while imported, ``SystemExit`` included), lacks the
function or fits no adapter (``dcpcheck.kernels.loading.KernelLoadError``); or it could be
asked none of the cases (every one not applicable here: it was never launched). No check
says the revision is good or bad, so ``git bisect run`` skips it."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, the shell's code), after writing partial reports."""

EXIT_TERMINATED = 143
"""SIGTERM (128 + 15: a CI job's timeout, ``kill``), after writing partial reports."""
