"""``python -m dcpcheck.distributed {run,hash} ...``: one rank (torchrun's or the launcher's)."""

from dcpcheck.cli.ranks import main

main()
