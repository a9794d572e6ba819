"""What every op's cases share, before and after they run: scenario files and their
limits, DCP ownership (block tables, slot mappings, local lengths), a DCP group's
collectives, seeded values, the memory a case will take, the table of options, and the
verdicts (checks, findings, case results) every report reads."""
