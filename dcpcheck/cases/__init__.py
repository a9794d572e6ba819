"""What a case of the fused op is, before anything runs: scenario files and their limits,
DCP ownership (block tables, slot mappings, local lengths), seeded values, the cost a
case will take, and the tolerance of every compared field."""
