"""Shared pytest setup: the `--run-gpu` switch and the Triton interpreter on CPU machines.

GPU tests are marked `gpu` and skipped unless `--run-gpu` is given (and a GPU is present). On a
machine without a GPU the Triton interpreter is enabled before anything imports triton, so every
kernel runs on CPU tensors.
"""

from __future__ import annotations

import os
import sys

import pytest

# Triton decides between interpreter and GPU when a kernel is defined, i.e. at import. Conftests
# of the folders named on the command line are imported before pytest_configure runs, so decide
# here, at import of this root conftest, which pytest loads first.
# pytest-xdist workers do not see the command line in sys.argv: the controller leaves a mark in
# the environment they inherit (without it, `-n 8 --run-gpu` ran every GPU test interpreted).
if "--run-gpu" in sys.argv:
    os.environ["RLTBENCH_PYTEST_RUN_GPU"] = "1"
elif os.environ.get("RLTBENCH_PYTEST_RUN_GPU") != "1" or "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.interpreter_ieee import install as _install_quiet_ieee
    from tests.interpreter_speed import install as _install_interpreter_speedup

    _install_interpreter_speedup()
    _install_quiet_ieee()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", default=False, help="run tests marked gpu on CUDA")
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (long interpreter or multi-process runs; CI runs them)")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--run-gpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests need --run-gpu; slow CPU tests need --slow, so the default run stays quick on two
    cores while CI (.ci/run passes --slow) keeps every test."""
    skip_gpu = pytest.mark.skip(reason="GPU test: run with --run-gpu on a CUDA machine")
    skip_slow = pytest.mark.skip(reason="slow CPU test: run with --slow (CI does)")
    for item in items:
        if "gpu" in item.keywords and not config.getoption("--run-gpu"):
            item.add_marker(skip_gpu)
        elif "slow" in item.keywords and not config.getoption("--slow") and not config.getoption("--run-gpu"):
            item.add_marker(skip_slow)


# GPU memory under pytest-xdist: each worker is a process with its own caching allocator, which
# keeps every freed block for reuse. A `-n 4` run once lost three tests to OOM because one
# worker's cache had grown to 129 GiB of the H200's 140 (bulk bitwise sweeps over many shapes).
# A per-process cap makes the allocator release its cached blocks when it reaches the cap instead
# of taking the other workers' memory; the cache is also emptied after each GPU test.
GPU_MEMORY_SHARE = 0.9


@pytest.fixture(autouse=True, scope="session")
def _gpu_memory_share(request: pytest.FixtureRequest) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers > 1 and request.config.getoption("--run-gpu"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE / workers)


@pytest.fixture(autouse=True)
def _release_gpu_cache(request: pytest.FixtureRequest):
    yield
    if "gpu" in request.keywords and request.config.getoption("--run-gpu"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@pytest.fixture(autouse=True, scope="session")
def _runs_without_result_dir_stay_out_of_the_checkout(tmp_path_factory: pytest.TempPathFactory):
    """A command run without --result-dir writes results/<command>-<UTC time>/ under the working
    directory, the checkout: the suite must leave nothing there for a later run (or a user) to find."""
    from rltbench.results import rundir

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rundir, "DEFAULT_ROOT", tmp_path_factory.mktemp("default-results"))
        yield
