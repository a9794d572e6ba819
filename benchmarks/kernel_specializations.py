"""How many binaries of the project's kernel a ``dcpcheck run`` compiles on a GPU, and why:
every launch of the run recorded on the CPU, with the key Triton compiles a binary for.

Triton compiles one binary per distinct key (``launch_keys`` says what a key holds). This
script runs ``dcpcheck run`` in process under the interpreter, every launch recorded,
takes ``BLOCK_T`` as a GPU launch has it (one token per program, whatever the
interpreter's tile) and splits a launch of ``launcher.GPU_Q_APART_FROM_TOKENS`` tokens or
more in two as a GPU does, and counts the distinct keys, then the distinct constexpr sets,
then what tells apart the keys of one constexpr set.

``--gpu-model`` gives the token-stream check the model widths it has on a GPU
(deepseek-v3.2; slower through the interpreter), so its launches are the GPU's too.

    PYTHONPATH=$PWD python3 benchmarks/kernel_specializations.py --dcp 4 --gpu-model
    PYTHONPATH=$PWD python3 benchmarks/kernel_specializations.py --dcp 4 --no-tokens
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from dcpcheck.backend import select_backend

select_backend("cpu")
sys.path.insert(0, str(Path(__file__).parent))

from launch_keys import Launch, recorded_launches  # noqa: E402

from dcpcheck.cli import cli  # noqa: E402
from dcpcheck.e2e import token_streams  # noqa: E402
from dcpcheck.ops.fused_norm_rope import launcher  # noqa: E402
from dcpcheck.ops.fused_norm_rope.kernel import TASK_KV, TASK_Q  # noqa: E402


def as_on_a_gpu(launches: Iterable[Launch]) -> Iterator[Launch]:
    """The launches a GPU makes for these: from ``GPU_Q_APART_FROM_TOKENS`` tokens, the
    sub-tasks up to KV and then Q alone (the interpreter always launches once)."""
    for launch in launches:
        [tokens] = [a.value for a in launch.arguments if a.name == "num_tokens"]
        if tokens < launcher.GPU_Q_APART_FROM_TOKENS:
            yield launch
            continue
        for first, last in ((launch.constexprs["FIRST_TASK"], TASK_KV.value), (TASK_Q.value,) * 2):
            constexprs = {**launch.constexprs, "FIRST_TASK": first, "LAST_TASK": last}
            yield dataclasses.replace(launch, constexprs=constexprs)


def main(argv: list[str]) -> None:
    if "--gpu-model" in argv:
        argv.remove("--gpu-model")
        token_streams.CPU_PRESET = token_streams.GPU_PRESET
    # click exits with the run's verdict, which is not this script's
    with recorded_launches(forward=True) as launches, contextlib.suppress(SystemExit):
        cli.main(["run", *argv], standalone_mode=False)
    # BLOCK_T as a GPU launch has it: one token per program, whatever the interpreter's tile.
    keys = {launch.key(ignore=("BLOCK_T",)) for launch in as_on_a_gpu(launches)}
    by_constexprs: dict[tuple, list[tuple]] = {}
    for constexprs, arguments in keys:
        by_constexprs.setdefault(constexprs, []).append(arguments)
    print(f"\n{len(keys)} binaries ({len(launches)} launches), {len(by_constexprs)} constexpr sets")
    for specializations in by_constexprs.values():
        if len(specializations) > 1:
            common = set.intersection(*(set(s) for s in specializations))
            differing = sorted({name for s in specializations for name, *_ in set(s) - common})
            print(f"  one constexpr set, {len(specializations)} binaries: differ in {differing}")


if __name__ == "__main__":
    main(sys.argv[1:])
