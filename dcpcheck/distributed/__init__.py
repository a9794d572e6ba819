"""Real ranks: dcpcheck with one DCP rank per process, through torch.distributed.

The simulated mode (``dcpcheck.ops.fused_norm_rope.runner``) runs every rank of a DCP group
in one process on one device. Here the DCP size is the world size and each process is one
rank, on its own device: ``cuda:LOCAL_RANK`` with NCCL when CUDA is available, else the CPU
and Triton's interpreter with gloo. For each scenario every rank builds the case with
``build_case`` (one seeded generator fills the ranks' caches in rank order, so building them
all is how a rank gets exactly the bytes the simulated mode gives it) and launches the
kernel on **its own** rank's inputs, slot mapping and caches; then it sends its launched
buffers to rank 0 (:class:`LaunchedRank`). Rank 0 runs the DCP1 baseline itself (it is one
rank), puts every rank's buffers into its case and runs the same checks
(``case_checks.check_case``), so the report is the simulated mode's: same verdicts, same
findings, same JSON. The token-stream check merges decode attention across processes with
all-gathers (``dcpcheck.distributed.streams``).

Three ways in:

* ``torchrun --nproc-per-node N -m dcpcheck run ...`` (or ``hash``; in a rank's
  environment ``dcpcheck.cli.main`` hands the command to ``dcpcheck.cli.ranks``): torchrun
  sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
* :func:`launch`: spawns the N processes itself with that same environment (rendezvous on
  127.0.0.1, a free port), watches them and stops them all when one fails;
* :func:`run_distributed` inside :func:`rank_group`, for a caller that parsed its options.

A rank that crashes or hangs ends the run. Each rank reports where it is (a heartbeat file,
when started by :func:`launch`); the launcher names a rank that died, or, when no rank has
made progress for ``--rank-timeout`` seconds, the rank(s) furthest behind: the others are
waiting for them at a collective. It then kills every rank's process group and checks that
none is left. Collectives time out ``COLLECTIVE_TIMEOUT_MARGIN_S`` later, so under plain
torchrun a stuck rank still ends the run, while under :func:`launch` the watchdog, which can
tell the stuck rank from the waiting ones, speaks first.
"""
