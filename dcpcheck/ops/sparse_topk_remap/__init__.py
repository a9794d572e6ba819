"""The sparse-topk-remap op: each DCP rank's local slots of a sparse attention's top-k token
picks, which must be where the write side put those tokens, on their owner and nowhere
else. ``contract`` holds its protocol, ``case`` a batch of picks laid out for every rank
and launched into guarded buffers, ``checks`` its contract, ``kernel`` the project's
Triton kernel, ``mutants`` it with one bug each; ``reference.sparse_topk_remap`` is its
oracle, built on the write side's (``reference.slot_mapping``).
"""
