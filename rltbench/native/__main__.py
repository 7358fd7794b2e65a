"""`python -m rltbench.native --build | --status`: build the native arm now, or say whether it can be.

--status (default) never compiles: one line, "native arm: available (...)" or "native arm:
unavailable: <reason>", exit 0 either way (scripts/setup.sh prints it). --build compiles (or
loads the cached build) for the visible GPU and prints the build record; exit 0 when the arm is
ready, 1 when it is unavailable (the reason on one line).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from rltbench import native
from rltbench.native import build


def status_line() -> str:
    """One line: available (with where it builds to) or unavailable with the reason."""
    reason = native.unavailable_reason()
    if reason is not None:
        return f"native arm: unavailable: {reason}"
    arch = build.arch_list()
    directory = build.cache_root() / build.build_key(arch)
    state = "built" if (directory / build.BUILD_RECORD).exists() else "builds at first use (about a minute)"
    return f"native arm: available (CUDA {torch.version.cuda}, arch {arch}; {state}; cache {directory})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rltbench.native", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--build", action="store_true", help="compile now (or load the cached build)")
    mode.add_argument("--status", action="store_true", help="say whether the arm can run here (default)")
    ap.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")
    args = ap.parse_args(argv)
    if not args.build:
        print(status_line())
        return 0
    try:
        native.load(verbose=args.verbose)
    except native.NativeUnavailable as exc:
        print(f"native arm: unavailable: {exc}")
        return 1
    info = native.build_info() or {}
    how = "loaded from the cache" if info.get("cached") else f"built in {info.get('seconds', 0):.1f} s"
    print(f"native arm: ready ({how}, arch {info.get('arch_list')}, {info.get('directory')})")
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
