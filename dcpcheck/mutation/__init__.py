"""Mutation testing of kernel files (``dcpcheck mutate``): how strong the gate is,
measured. ``operators`` makes a file's mutants, ``selection`` picks the ones a run takes,
``equivalents`` reads what a kernel's authors explained, ``runner`` runs each through the
gate in a worker (``worker``), ``campaign`` is the library call and its score, ``report``
its console, JSON and JUnit."""
