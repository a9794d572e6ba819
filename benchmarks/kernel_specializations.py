"""How many binaries of the project's kernel a ``dcpcheck run`` compiles on a GPU, and why:
every launch of the run recorded on the CPU, with the key Triton compiles a binary for.

Triton compiles one binary per distinct key: the constexprs, the argument dtypes, and its
own specializations of the other arguments (an integer equal to 1 or divisible by 16, a
pointer whose address is divisible by 16), except the arguments the kernel declares
``do_not_specialize``. This script runs ``dcpcheck run`` in process under the interpreter
with a recorder around the kernel, takes ``BLOCK_T`` as a GPU launch has it (one token
per program, whatever the interpreter's tile), and counts the distinct keys, then the
distinct constexpr sets, then what tells apart the keys of one constexpr set.

``--gpu-model`` gives the token-stream check the model widths it has on a GPU
(deepseek-v3.2; slower through the interpreter), so its launches are the GPU's too.

    PYTHONPATH=$PWD python3 benchmarks/kernel_specializations.py --dcp 4 --gpu-model
    PYTHONPATH=$PWD python3 benchmarks/kernel_specializations.py --dcp 4 --no-tokens
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter

import torch

from dcpcheck.backend import select_backend

select_backend("cpu")

from dcpcheck.cli import cli  # noqa: E402
from dcpcheck.e2e import token_streams  # noqa: E402
from dcpcheck.kernels import launcher  # noqa: E402

NOT_SPECIALIZED = {"num_tokens", "cache_block_size", "mla_num_blocks"}
"""The kernel's ``do_not_specialize`` arguments (``fused_norm_rope.py``)."""


class Recorder:
    """Wraps the interpreted kernel: ``kernel[grid](*args, **kwargs)`` records its key."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.names = list(inspect.signature(kernel.fn).parameters)
        self.keys: Counter = Counter()

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            specialized = []
            for name, value in zip(self.names[: len(args)], args, strict=True):
                if isinstance(value, torch.Tensor):
                    specialized.append((name, str(value.dtype), value.data_ptr() % 16 == 0))
                elif isinstance(value, int) and name not in NOT_SPECIALIZED:
                    specialized.append((name, value == 1, value % 16 == 0))
            constexprs = tuple(
                sorted((k, v) for k, v in kwargs.items() if k in self.names and k != "BLOCK_T")
            )
            self.keys[(constexprs, tuple(specialized))] += 1
            return self.kernel[grid](*args, **kwargs)

        return launch


def main(argv: list[str]) -> None:
    if "--gpu-model" in argv:
        argv.remove("--gpu-model")
        token_streams.CPU_PRESET = token_streams.GPU_PRESET
    recorder = Recorder(launcher._fused_norm_rope_kernel)
    launcher._fused_norm_rope_kernel = recorder
    try:
        cli.main(["run", *argv], standalone_mode=False)
    except SystemExit:
        pass
    finally:
        launcher._fused_norm_rope_kernel = recorder.kernel
    by_constexprs: dict[tuple, list[tuple]] = {}
    for constexprs, specialized in recorder.keys:
        by_constexprs.setdefault(constexprs, []).append(specialized)
    print(
        f"\n{len(recorder.keys)} binaries ({sum(recorder.keys.values())} launches), "
        f"{len(by_constexprs)} distinct constexpr sets"
    )
    for specializations in by_constexprs.values():
        if len(specializations) > 1:
            common = set.intersection(*(set(s) for s in specializations))
            differing = sorted({name for s in specializations for name, *_ in set(s) - common})
            print(f"  one constexpr set, {len(specializations)} binaries: differ in {differing}")


if __name__ == "__main__":
    main(sys.argv[1:])
