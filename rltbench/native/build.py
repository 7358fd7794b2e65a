"""The native extension's cached JIT build (torch.utils.cpp_extension.load), keyed by what decides
the binary: the sources, the torch and CUDA versions, the architectures and the flags.

Why a JIT build at first use rather than a CUDAExtension at install: the package then installs as
pure Python everywhere (no nvcc at install, no build isolation issues), the architectures come
from the GPU actually visible when the arm is used (TORCH_CUDA_ARCH_LIST overrides them, e.g. to
cross-compile), and a GPU machine that starts from a fresh copy of the tree needs no install step.
The commands build before any timed cell (when they check the arm), and the build's time is in
every manifest (rltbench.results.provenance). docs/native.md has the details.

Cache: ``$RLTBENCH_NATIVE_CACHE`` if set, else ``$XDG_CACHE_HOME/rltbench/native`` (default
``~/.cache/rltbench/native``), one directory per build key; torch's file lock there keeps
concurrent processes (pytest-xdist workers) from building the same key twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import torch

from rltbench import knobs

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("binding.cpp", "device.cu", "norm.cu", "act.cu", "rope.cu")
HEADERS = ("common.cuh", "native.h", "norm_rows.cuh")
# No fast math anywhere: torch's own kernels are built without it, so expf, the IEEE division and
# rsqrtf (rsqrt.approx.f32 without FTZ) compile to what torch runs. Order-sensitive arithmetic uses
# __fmul_rn/__fadd_rn, which are never contracted into FMAs.
CUDA_FLAGS = ("-O3", "--expt-relaxed-constexpr", "-lineinfo")
CXX_FLAGS = ("-O3",)
CACHE_ENV = "RLTBENCH_NATIVE_CACHE"
BUILD_RECORD = "rltbench_build.json"


@dataclass
class BuildInfo:
    """What was built (or loaded from the cache) and how long it took; goes into manifests."""

    key: str
    directory: str
    arch_list: str
    torch_version: str
    cuda_version: str
    nvcc: str
    seconds: float           # this process: the build, or only the load when cached
    cached: bool             # True when an earlier process had built this key
    build_seconds: float     # the compile time of the process that built it

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def cache_root() -> Path:
    """Where builds are kept (see the module docstring)."""
    chosen = knobs.get(CACHE_ENV)
    if isinstance(chosen, Path):
        return chosen.expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "rltbench" / "native"


def find_nvcc() -> str | None:
    """nvcc as torch.utils.cpp_extension will find it: $CUDA_HOME / $CUDA_PATH, then PATH, then
    /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var, "").strip()
        if home:
            cand = Path(home) / "bin" / "nvcc"
            return str(cand) if cand.exists() else None
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def find_ninja() -> str | None:
    """ninja on PATH, or the one the `ninja` pip package put next to this interpreter (a venv run
    without activation has it there, off PATH)."""
    found = shutil.which("ninja")
    if found is None:
        cand = Path(sys.executable).parent / "ninja"
        found = str(cand) if cand.exists() else None
    return found


def nvcc_version(nvcc: str) -> str:
    """'13.0' from `nvcc --version` (empty when it cannot be run)."""
    import subprocess

    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else ""


def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST if set, else every visible GPU's compute capability ('9.0')."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return env
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in caps)


def build_key(arch: str) -> str:
    """A hash of everything that decides the binary."""
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    for part in (torch.__version__, str(torch.version.cuda), arch, " ".join(CUDA_FLAGS), " ".join(CXX_FLAGS),
                 platform.python_version(), sys.platform):
        h.update(part.encode())
    return h.hexdigest()[:16]


def build(verbose: bool = False) -> tuple[ModuleType, BuildInfo]:
    """Build (or load the cached build of) the extension for the visible GPU. Raises whatever
    torch.utils.cpp_extension raises on a failed compile (the caller turns it into a reason)."""
    # function-level import: cpp_extension pulls in setuptools, a cost only the native arm pays
    from torch.utils import cpp_extension

    nvcc = find_nvcc() or "nvcc"
    ninja = find_ninja()
    if ninja is not None and shutil.which("ninja") is None:  # torch runs `ninja` from PATH
        os.environ["PATH"] = f"{Path(ninja).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    arch = arch_list()
    key = build_key(arch)
    directory = cache_root() / key
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / BUILD_RECORD
    cached = record.exists()
    t0 = time.perf_counter()
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        module = cpp_extension.load(
            name=f"rltbench_native_{key}",
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS),
            extra_include_paths=[str(CSRC)],
            build_directory=str(directory),
            verbose=verbose,
        )
    finally:
        if saved is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved
    seconds = time.perf_counter() - t0
    build_seconds = seconds
    if cached:
        try:
            build_seconds = float(json.loads(record.read_text()).get("build_seconds", seconds))
        except (OSError, ValueError):
            pass
    info = BuildInfo(key, str(directory), arch, torch.__version__, str(torch.version.cuda),
                     f"{nvcc} ({nvcc_version(nvcc) or 'version unknown'})", round(seconds, 3), cached,
                     round(build_seconds, 3))
    if not cached:
        record.write_text(json.dumps(info.to_dict(), indent=1) + "\n")
    return module, info
