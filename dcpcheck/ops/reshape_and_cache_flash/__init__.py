"""The reshape-and-cache-flash op: the paged K/V cache write of non-MLA attention, which under
DCP must write, on each rank, exactly the tokens its slot mapping gives it and nothing else.
``contract`` holds its protocol, ``case`` a step's tokens laid out for every rank and
launched into poisoned caches, ``checks`` its contract, ``kernel`` the project's Triton
kernel, ``mutants`` it with one bug each, ``vllm`` a release's function as its attention
backend calls it; ``reference.reshape_and_cache_flash`` is its oracle.
"""
