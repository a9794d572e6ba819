"""The slot-mapping op: every rank's slot of every batch row in every cache group under
DCP (docs/dcp-contract.md, "Ownership"), the mapping every cache write and read of a layer
follows. ``contract`` holds its protocol, ``kernel`` the project's Triton kernel for it,
``reference.slot_mapping`` its oracle."""
