"""The lse-combine op: the merge of the DCP ranks' partial attentions by their
log-sum-exps into what one rank attending over the whole context computes. ``contract``
holds its protocol (its ranks meet in a ``dcpcheck.cases.collectives.Group``, simulated
in one process, or over torch.distributed in ``real_ranks``' process per rank), ``case`` a batch of
decode rows and every rank's partials, ``checks`` its contract and tolerances, ``chain``
the merge of partials from a real decode attention (``attention``, the project's), ``kernel``
the project's merge (a Triton correction), ``mutants`` it with one bug each, ``vllm`` the
released merges; ``reference.lse_combine`` is its oracle.
"""
