"""The slot-mapping op: every rank's slot of every batch row in every cache group under
DCP, and every rank's local length of every request (docs/dcp-contract.md, "Ownership"),
which every cache write and every decode attention of a layer follow. ``contract`` holds
its protocols, ``case`` a batch laid out for every rank and launched into guarded buffers,
``checks`` and ``seq_lens`` its contract, ``kernel`` the project's Triton kernels,
``mutants`` those kernels with one bug each, ``vllm`` and ``vllm_v1`` vLLM's routines;
``reference.slot_mapping`` is its oracle.
"""
