"""The slot-mapping op: every rank's slot of every batch row in every cache group under
DCP (docs/dcp-contract.md, "Ownership"), the mapping every cache write and read of a layer
follows. ``contract`` holds its protocol, ``case`` a batch laid out for every rank and
launched into guarded buffers, ``checks`` its contract, ``kernel`` the project's Triton
kernel, ``mutants`` that kernel with one bug each; ``reference.slot_mapping`` is its
oracle."""
