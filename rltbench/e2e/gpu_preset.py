"""The e2e runs of the lead's GPU script (issue 5 done-when), as argument lists and a tiny runner.

    python -m rltbench.e2e.gpu_preset burst   results/gpu/e2e-burst     # Ouro-1.4B, 4 arms, C 1..128
    python -m rltbench.e2e.gpu_preset session results/gpu/e2e-session   # Mooncake replay, prefix hits

Equivalent `rltbench e2e ...` command lines: `python -m rltbench.e2e.gpu_preset print`.
Sizing (H200, bf16, random weights): the burst is 4 arms (torch, exact, approx, torch#2 for the A/A
noise floor) x 4 cells x 2 repetitions of 512 in / 128 out; the C=128 cell needs ~60 GiB of KV
(768 KiB per token), so all arms share one pool in one process. A global deadline keeps each run
inside its budget (unfinished cells are reported as skipped, never silently dropped).
"""

from __future__ import annotations

import sys

BURST = (
    "e2e --model ouro-1.4b --weights random --arms torch,exact,approx,torch --workload burst "
    "--concurrency 1,8,32,128 --input-len 512 --output-len 128 --repeats 2 --seed 0 --dtype bfloat16 "
    "--device cuda --deadline 540 --no-live"
).split()
SESSION = (
    "e2e --model ouro-1.4b --weights random --arms torch,exact,approx --workload session "
    "--trace mooncake-h200 --repeats 1 --seed 0 --dtype bfloat16 --device cuda --deadline 420 --no-live"
).split()
PRESETS = {"burst": BURST, "session": SESSION}


def argv(name: str, result_dir: str) -> list[str]:
    """The CLI arguments of preset `name` writing into `result_dir`."""
    return [*PRESETS[name], "--result-dir", result_dir]


def main(args: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["print"]:
        for name in PRESETS:
            print("rltbench " + " ".join(argv(name, f"results/gpu/e2e-{name}")))
        return 0
    if len(args) != 2 or args[0] not in PRESETS:
        print("usage: python -m rltbench.e2e.gpu_preset burst|session RESULT_DIR | print", file=sys.stderr)
        return 2
    from rltbench.cli import main as cli_main

    return cli_main(argv(args[0], args[1]))


if __name__ == "__main__":
    sys.exit(main())
