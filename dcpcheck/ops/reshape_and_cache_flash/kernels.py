"""The kernels of the op dcpcheck can name (``contract.CacheWriteKernel``):

* ``default``: the project's Triton kernel (``kernel``); ``mutant/NAME``: it with one bug
  (``mutants``);
* ``vllm==X.Y.Z``: a released vLLM's ``triton_reshape_and_cache_flash`` as its attention
  backend calls it (``dcpcheck.ops.reshape_and_cache_flash.vllm``), fetched and cached by
  ``dcpcheck.kernels.releases``;
* ``package.module:function`` or ``path/to/file.py:function``: a callable with the op's
  protocol.

Import only once the backend is chosen (it defines Triton kernels).
"""

from __future__ import annotations

from pathlib import Path

from dcpcheck.kernels import loading, releases
from dcpcheck.kernels.loading import JudgedFile
from dcpcheck.kernels.registry import OpKernels, adapted, described
from dcpcheck.op_registry import RESHAPE_AND_CACHE_FLASH
from dcpcheck.ops.reshape_and_cache_flash import kernel as project_kernel
from dcpcheck.ops.reshape_and_cache_flash import mutants, vllm
from dcpcheck.ops.reshape_and_cache_flash.contract import CacheWriteKernel


def _file(release: releases.ReleaseSpec) -> JudgedFile:
    return loading.release_file(release.version, release.name, vllm.FUNCTION, vllm.MEMBERS)


def _release(release: releases.ReleaseSpec, named: bool) -> CacheWriteKernel:
    path = Path(_file(release).path)
    return adapted(vllm.VllmCacheWrite.of, path, release.name, release.version)


REGISTRY: OpKernels[CacheWriteKernel] = OpKernels(
    op=RESHAPE_AND_CACHE_FLASH,
    kernels={
        "default": project_kernel.write,
        **{loading.mutant_name(m): m for m in mutants.MUTANTS},
    },
    descriptions=described("the project's paged K/V cache write, in Triton", mutants.MUTANTS),
    sources=(project_kernel.__file__, mutants.__file__),
    function=vllm.FUNCTION,
    judged=(vllm.FUNCTION,),
    release=_release,
    release_files=lambda release, named: (_file(release),),
    named_in_canonical=False,
)
"""The op's kernels by spec (module docstring)."""
