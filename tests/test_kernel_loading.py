"""Resolving ``--kernel``: every form that loads, and every way of failing, each a
:class:`KernelLoadError` with one line naming the cause, which the CLI turns into exit
code 125 (``git bisect run``'s "skip"); a spec wrong in itself (a misspelt registry name)
is a :class:`KernelSpecError`, bad input (exit code 2), not a revision to skip."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dcpcheck.cases.verdicts import RunConfig
from dcpcheck.cli import cli
from dcpcheck.exit_codes import EXIT_KERNEL_LOAD, EXIT_USAGE
from dcpcheck.kernels.loading import (
    KernelLoadError,
    KernelSpecError,
    UnknownKernelName,
    import_root,
)
from dcpcheck.ops.fused_norm_rope.kernels import load_kernel
from dcpcheck.ops.fused_norm_rope.runner import run_scenario
from dcpcheck.ops.fused_norm_rope.scenario import load_scenarios
from dcpcheck.ops.fused_norm_rope.vllm import ApiShape, VllmFusedNormRope
from tests.conftest import BACKEND
from tests.forked_commands import run_dcpcheck
from tests.kernels_under_test import oracle_kernel

REPO = Path(__file__).parents[1]
FIXTURES = REPO / "tests" / "fixtures"
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None

# name -> (file contents or None, spec with {file} for its path, adapter, cause in message)
BAD_KERNELS = {
    "unknown registry name": (None, "regress/nope", "auto", "unknown kernel 'regress/nope'"),
    "missing file": (None, "{dir}/missing.py:fused", "auto", "no such kernel file"),
    "file without the function": (
        "def other(inputs, outputs, caches):\n    pass\n",
        "{file}:fused",
        "auto",
        "has no function 'fused'",
    ),
    "syntax error": ("def fused(inputs,:\n    pass\n", "{file}:fused", "auto", ":1: syntax error"),
    "import error inside the file": (
        "import dcpcheck_no_such_module\n",
        "{file}:fused",
        "auto",
        "No module named 'dcpcheck_no_such_module'",
    ),
    "exception at import": (
        "raise RuntimeError('no GPU of that kind')\n",
        "{file}:fused",
        "auto",
        "import failed: RuntimeError: no GPU of that kind",
    ),
    "non-callable": ("fused = 3\n", "{file}:fused", "auto", "fused is not callable"),
    "missing module": (
        None,
        "dcpcheck_no_such_package.kernels:fused",
        "auto",
        "cannot import: No module named 'dcpcheck_no_such_package'",
    ),
    "file without :function": (None, "{dir}/kernels.py", "auto", "name the function too"),
    "neither protocol nor vLLM signature": (
        "def fused(x):\n    pass\n",
        "{file}:fused",
        "auto",
        "neither kernel(inputs, outputs, caches) nor a known vLLM",
    ),
    "vLLM host module without a stand-in": (
        "from vllm.model_executor.custom_op import CustomOp\n",
        "{file}:fused",
        "auto",
        "needs vllm.model_executor, and vllm is not installed",
    ),
    "vLLM name a stand-in does not provide": (
        "from vllm.utils.torch_utils import direct_register_custom_op\n",
        "{file}:fused",
        "auto",
        "needs direct_register_custom_op from vllm.utils.torch_utils, which dcpcheck's stand-in",
    ),
    "vllm adapter on a protocol kernel": (
        "def fused(inputs, outputs, caches):\n    pass\n",
        "{file}:fused",
        "vllm",
        "not a known vLLM fused_norm_rope signature",
    ),
    "registry kernel with the vllm adapter": (None, "default", "vllm", "does not apply"),
    "unknown adapter": (None, "default", "cuda-graphs", "unknown adapter 'cuda-graphs'"),
    "module without a function name": (None, "mykernels.kernels:", "auto", "expected module:"),
    "vLLM release with the native adapter": (
        None,
        "vllm==0.29.0",
        "native",
        "runs through the vllm adapter",
    ),
}
SPEC_ERRORS = {
    "unknown registry name",
    "file without :function",
    "module without a function name",
    "registry kernel with the vllm adapter",
    "unknown adapter",
    "vLLM release with the native adapter",
}
"""Bad specs that no revision of any file would load: KernelSpecError, exit code 2."""
CLI_EXPRESSIBLE = [name for name, (_, _, adapter, _) in BAD_KERNELS.items() if adapter == "auto"]


def _spec(name: str, tmp_path: Path) -> str:
    contents, spec, _, _ = BAD_KERNELS[name]
    file = tmp_path / "kernels.py"
    if contents is not None:
        file.write_text(contents)
    return spec.format(file=file, dir=tmp_path)


def _skip_if_vllm_installed(name: str):
    if name.startswith("vLLM") and VLLM_INSTALLED:
        pytest.skip("vllm is installed, so no stand-in is used")


@pytest.mark.parametrize("name", list(BAD_KERNELS))
def test_bad_kernel_raises_one_line_naming_the_cause(tmp_path, name):
    _skip_if_vllm_installed(name)
    spec = _spec(name, tmp_path)
    modules_before = set(sys.modules)
    with pytest.raises(KernelLoadError) as raised:
        load_kernel(spec, adapter=BAD_KERNELS[name][2])
    message = str(raised.value)
    assert "\n" not in message
    assert BAD_KERNELS[name][3] in message
    leftovers = {m for m in set(sys.modules) - modules_before if m.split(".")[0] == "vllm"}
    assert not leftovers, "stand-ins must not outlive a failed load"


@pytest.mark.parametrize("name", list(BAD_KERNELS))
def test_only_a_spec_wrong_in_itself_is_a_spec_error(tmp_path, name):
    _skip_if_vllm_installed(name)
    with pytest.raises(KernelLoadError) as raised:
        load_kernel(_spec(name, tmp_path), adapter=BAD_KERNELS[name][2])
    assert isinstance(raised.value, KernelSpecError) == (name in SPEC_ERRORS)


@pytest.mark.parametrize(
    ("name", "suggestions"),
    [
        ("regress/pre-5490", ["regress/pre-54908", "regress/pre-50005"]),
        ("mutant/eps-outside-sqrt", ["mutant/eps-outside-rsqrt"]),
        ("defualt", ["default"]),
        ("mykernels.kernels", []),  # a module without :function
    ],
)
def test_an_unknown_name_names_the_closest_registry_names(name, suggestions):
    with pytest.raises(UnknownKernelName) as raised:
        load_kernel(name)
    assert raised.value.name == name
    assert raised.value.suggestions == suggestions
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"unknown kernel {name!r}: no registry kernel has that name")
    assert ("closest: " + ", ".join(suggestions) in message) == bool(suggestions)
    assert "all: dcpcheck list kernels" in message


@pytest.mark.parametrize("name", [n for n in CLI_EXPRESSIBLE if n not in SPEC_ERRORS])
def test_cli_exit_code_is_125_for_a_bad_kernel(tmp_path, name):
    _skip_if_vllm_installed(name)
    spec = _spec(name, tmp_path)
    result = CliRunner().invoke(cli, ["run", "--kernel", spec, "--scenario", "decode-single-dcp4"])
    assert result.exit_code == EXIT_KERNEL_LOAD == 125, result.output


@pytest.mark.parametrize("name", [n for n in CLI_EXPRESSIBLE if n in SPEC_ERRORS])
def test_cli_exit_code_is_2_for_a_spec_wrong_in_itself(tmp_path, name):
    spec = _spec(name, tmp_path)
    result = CliRunner().invoke(cli, ["run", "--kernel", spec, "--scenario", "decode-single-dcp4"])
    assert result.exit_code == EXIT_USAGE == 2, result.output


def test_dcpcheck_process_prints_one_error_line_and_exits_125(tmp_path):
    broken = tmp_path / "kernels.py"
    broken.write_text("def fused(inputs,:\n")
    done = subprocess.run(
        [sys.executable, "-m", "dcpcheck", "run", "--kernel", f"{broken}:fused", "--device", "cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 125
    errors = [line for line in done.stderr.splitlines() if line.startswith("dcpcheck: error:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"dcpcheck: error: {broken}:1: syntax error")


def test_registry_module_and_file_forms_load():
    assert callable(load_kernel("default"))
    assert load_kernel("tests.kernels_under_test:oracle_kernel") is oracle_kernel
    from_file = load_kernel(f"{REPO}/tests/kernels_under_test.py:oracle_kernel")
    assert from_file.__name__ == "oracle_kernel"
    assert from_file is not oracle_kernel  # its own module, loaded from the file


@pytest.mark.parametrize(
    ("function", "verdict"), [("oracle_kernel", "pass"), ("skips_foreign_kv", "fail")]
)
def test_a_kernel_loaded_from_a_file_is_judged_like_any_other(function, verdict):
    kernel = load_kernel(f"{REPO}/tests/kernels_under_test.py:{function}")
    [scenario] = load_scenarios(["decode-single-dcp4"])
    [result] = run_scenario(kernel, scenario, RunConfig(function, (4,)), BACKEND)
    assert result.status == verdict


@pytest.mark.parametrize(
    ("file", "shape"),
    [
        ("vllm_inplace_api.py", ApiShape.IN_PLACE),
        ("vllm_separate_outputs_api.py", ApiShape.SEPARATE_OUTPUTS),
    ],
)
@pytest.mark.parametrize("adapter", ["auto", "vllm"])
def test_vllm_signatures_get_the_vllm_adapter(file, shape, adapter):
    kernel = load_kernel(f"{FIXTURES / file}:fused_norm_rope", adapter=adapter)
    assert isinstance(kernel, VllmFusedNormRope)
    assert kernel.shape is shape


def test_native_adapter_refuses_a_vllm_signature():
    with pytest.raises(KernelLoadError, match="neither kernel"):
        load_kernel(f"{FIXTURES / 'vllm_separate_outputs_api.py'}:fused_norm_rope", "native")


def _write_package(root: Path, package: str) -> None:
    """``root/package/kernels.py`` with ``oracle_kernel`` (re-exported from the tests)."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (root / package / "kernels.py").write_text(
        "from tests.kernels_under_test import oracle_kernel\n"
    )


@pytest.fixture
def forget_modules():
    """Drop the modules a test imported under the given top-level names when it ends."""
    names: list[str] = []
    yield names.append
    for module in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[module]


def test_a_module_spec_imports_from_the_working_directory_and_keeps_it_on_the_path(
    tmp_path, monkeypatch, forget_modules
):
    """As ``python -m`` has it, though the ``dcpcheck`` script's ``sys.path`` starts
    elsewhere: modelled here by a ``sys.path`` without the working directory."""
    _write_package(tmp_path, "dcpcheck_cwd_kernels")
    forget_modules("dcpcheck_cwd_kernels")
    here = os.path.realpath(tmp_path)
    without_cwd = [p for p in sys.path if p and os.path.realpath(p) != here]
    monkeypatch.setattr(sys, "path", without_cwd)
    monkeypatch.chdir(tmp_path)
    assert load_kernel("dcpcheck_cwd_kernels.kernels:oracle_kernel") is oracle_kernel
    assert sys.path[0] == here  # first, and still there for the module's later imports
    load_kernel("dcpcheck_cwd_kernels.kernels:oracle_kernel")
    assert sys.path.count(here) == 1


def test_a_module_that_calls_sys_exit_while_imported_does_not_load(tmp_path):
    """A load error (exit 125), never the exit status of the process importing it."""
    path = tmp_path / "exits.py"
    path.write_text("import sys\ndef fused(inputs, outputs, caches):\n    pass\nsys.exit(0)\n")
    with pytest.raises(KernelLoadError, match=r"exits.py: import failed: SystemExit: 0$"):
        load_kernel(f"{path}:fused")


def test_a_probed_import_that_ends_its_process_ends_the_probe_not_this_one(tmp_path):
    """Under ``probing`` (every command holds it) a child imports the module first."""
    from dcpcheck.kernels import import_probe

    path = tmp_path / "ends.py"
    path.write_text("import os\nos._exit(0)\n")
    with import_probe.probing(), pytest.raises(import_probe.KernelImportLost) as lost:
        load_kernel(f"{path}:fused")
    assert lost.value.status == "crash"
    assert str(lost.value) == (
        f"{path}: its import ended the process running it (exited with status 0 without answering)"
    )
    with import_probe.probing():  # a module that imports is then imported here
        assert load_kernel(f"{REPO}/tests/kernels_under_test.py:oracle_kernel") is not None


def test_import_root_is_the_directory_a_module_spec_was_found_in(
    tmp_path, monkeypatch, forget_modules
):
    src = tmp_path / "src"
    _write_package(src, "dcpcheck_src_kernels")
    forget_modules("dcpcheck_src_kernels")
    monkeypatch.syspath_prepend(str(src))  # what pytest's pythonpath = ["src"] does
    spec = "dcpcheck_src_kernels.kernels:oracle_kernel"
    assert import_root(spec) == src.resolve()  # found without running the package's code
    assert "dcpcheck_src_kernels" not in sys.modules
    load_kernel(spec)
    assert import_root(spec) == src.resolve()
    assert import_root("dcpcheck_src_kernels:kernels") == src.resolve()  # a package
    assert import_root("tests.kernels_under_test:oracle_kernel") == REPO.resolve()
    assert import_root("default") is None
    assert import_root(f"{FIXTURES / 'vllm_inplace_api.py'}:fused_norm_rope") is None
    assert import_root("vllm==0.29.0") is None


def test_the_stand_in_warning_is_said_once_though_an_isolated_worker_loads_the_file_too(
    tmp_path,
):
    """Only the worker loads the kernel (a file kernel runs isolated by default), and only
    the run's first worker warns: one warning on the shared stderr, not one per process."""
    kernel = tmp_path / "k.py"
    kernel.write_text(
        "from vllm.triton_utils import triton  # answered by dcpcheck's stand-in\n"
        "from tests.kernels_under_test import oracle_kernel\n"
        "def fused(inputs, outputs, caches):\n"
        "    oracle_kernel(inputs, outputs, caches)\n"
    )
    done = run_dcpcheck(
        ["run", "--kernel", f"{kernel}:fused", "--dcp", "1", "--no-tokens", "--scenario",
         "decode-single-dcp4"],
        cwd=REPO,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("vllm is not installed") == 1, done.stderr


NAMES_ONLY = """
import sys
from dcpcheck.ops import package

op = package("fused-norm-rope")
op.check_kernel("default")
op.check_kernel("mutant/negative-slot-wraps", "native")
assert [f.path.rsplit("/", 1)[1] for f in op.judged_files("default")][0] == "launcher.py"
assert "default" in op.kernels()
built = [m for m in sys.modules if m.startswith("dcpcheck.ops.fused_norm_rope.launcher")]
assert not built and "triton" not in sys.modules, built
"""


def test_checking_or_listing_a_registry_kernel_builds_none():
    """A registry name is known by its name: checking it, naming its files or listing it
    imports no Triton module (the parent of an isolated run asks only this, and a command
    refused on its spec has not chosen a backend)."""
    done = subprocess.run([sys.executable, "-c", NAMES_ONLY], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
