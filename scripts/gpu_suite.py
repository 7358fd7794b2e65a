#!/usr/bin/env python3
"""The one GPU script: GPU tests and every benchmark, results under results/gpu/<stage>/.

GPU time is often rationed (e.g. 10-minute calls on a shared machine), so this runs the stages in
order, each in its own process with its own time limit, keeps going when one fails, and records what ran, how
long it took and how it ended in results/gpu/suite.json. Every stage directory ends with a manifest
(provenance and a final status): the stage's own run directory, finalised here when its command
exited without a final status (a time limit, a crash), or one written here for commands that write
none (tests, memcheck, env), so the numbers quoted in notes and README come from files. Then the
stage's files and its suite.json entry lose this machine's paths (rltbench/results/portable.py):
the checkout becomes relative paths, the Python environment, home and temp dir placeholders.

    python scripts/gpu_suite.py                 # all stages
    python scripts/gpu_suite.py tests kernels   # some stages
    python scripts/gpu_suite.py --list
    python scripts/gpu_suite.py profile profile@base   # the same stage from a baseline tree too

A stage named `STAGE@base` runs STAGE's command from the tree packed in `.base.tgz`
(`git archive --format=tar.gz -o .base.tgz REV rltbench scripts workloads`, carried with the call;
`git get-tar-commit-id` names REV in its manifests) into results/gpu/STAGE-base: a refactor or a
kernel change measured against its baseline on the same GPU in the same call, where figures from
another call or another card cannot be compared.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as `python scripts/gpu_suite.py`: rltbench from this tree

from rltbench.results import RunDir, atomic_write_text, dumps  # noqa: E402
from rltbench.results.portable import machine_prefixes, make_portable, portable_text  # noqa: E402

RESULTS = ROOT / "results" / "gpu"
PY = sys.executable
RLT = [PY, "-m", "rltbench.cli"]
# where the carried wheels are installed when lm_eval is not importable (a scratch directory)
SITE = Path(tempfile.gettempdir()) / "rltbench-site"
# what a stage directory's files and suite.json say instead of this machine's paths
PORTABLE = machine_prefixes(ROOT)

OURO = "--model ouro-1.4b --weights random --dtype bfloat16 --device cuda --seed 0 --no-live"
PD = ("--weights random --dtype bfloat16 --seed 0 --arm exact --concurrency 1,8,32 --input-len 512 "
      "--output-len 128 --repeats 2")


def rlt(args: str, out: str) -> list[str]:
    """An rltbench command line writing into results/gpu/<out>."""
    return RLT + shlex.split(args) + ["--result-dir", str(RESULTS / out)]


def with_tuned(out: str, section: str, values: dict[str, object], cmd: list[str]) -> list[str]:
    """`cmd` under RLTBENCH_TUNED: a copy of this GPU's tuned file with `section` updated by `values`,
    written into results/gpu/<out>/tuned.json when the stage runs (the one override mechanism)."""
    path = RESULTS / out / "tuned.json"
    make = ("import json, pathlib, torch; from rltbench import tuned; "
            "p = tuned.path_for(torch.cuda.get_device_name()); "
            "d = json.loads(p.read_text()) if p.is_file() else {}; "
            f"d.setdefault({section!r}, {{}}).update({values!r}); q = pathlib.Path({str(path)!r}); "
            "q.parent.mkdir(parents=True, exist_ok=True); q.write_text(json.dumps(d, indent=1))")
    return ["bash", "-c", shlex.join([PY, "-c", make]) + " && "
            + shlex.join(["env", f"RLTBENCH_TUNED={path}", *cmd])]


def gpu_tests(out: str, *paths: str, workers: str | None = None, report: str = "-rfE") -> list[str]:
    """A pytest command line for the GPU-marked tests in `paths` (over `workers` pytest-xdist processes
    when given), its JUnit XML written into results/gpu/<out>; `report` picks pytest's summary lines."""
    spread = ["-n", workers] if workers else []
    return [PY, "-m", "pytest", "-q", *spread, "--run-gpu", "-m", "gpu", "-p", "no:cacheprovider", report,
            "--junitxml", str(RESULTS / out / "junit.xml"), *paths]


def gpu_test_workers(per_worker_gib: float = 15.5, most: int = 8) -> int:
    """pytest-xdist workers for the GPU tests: tests/conftest.py caps each worker at 0.9 / workers of
    the GPU's memory, and the Huginn-0125 and Ouro-1.4B tests in CUDA graphs need more than 14 GiB
    with what a worker's allocator keeps, so the count follows the card: 8 on a 141 GiB H200 (15.8
    GiB each, the suite's long-standing setting), 4 on an 80 GiB H100, where 8 workers ran out of
    memory and 5 lost three captures (at 5c8fe9a; 4 workers: results/gpu/tests, all passed)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        total_gib = int(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return most  # no nvidia-smi (a CPU machine listing the stages): the count is not used
    return max(1, min(most, int(0.9 * total_gib // per_worker_gib)))


GPU_WORKERS = str(gpu_test_workers())


def rltbench_stages(stages: dict[str, tuple[int, str | list[str]]]) -> dict[str, tuple[int, list[str]]]:
    """The stages with each one given as a string made an rltbench command line writing into
    results/gpu/<its stage name> (rlt); a list is a command line as it is."""
    return {name: (limit, rlt(cmd, name) if isinstance(cmd, str) else cmd)
            for name, (limit, cmd) in stages.items()}

# name -> (time limit in seconds, command): a string is an rltbench command line writing into
# results/gpu/<name>, a list a command line as it is. Commands run from the repo root.
STAGES: dict[str, tuple[int, list[str]]] = rltbench_stages({
    "env": (60, ["bash", "-c", "nvidia-smi; python3 -c 'import torch, triton; print(torch.__version__, "
                 "torch.version.cuda, triton.__version__, torch.cuda.get_device_name(0))'"]),
    # the native arm (CUDA C++, rltbench/native): one build from the clean tree, before anything uses it
    "native-build": (300, [PY, "-m", "rltbench.native", "--build"]),
    # workers by GPU memory (gpu_test_workers): one process took 115 s with a warm Triton cache and ran
    # past 260 s on a cold one; 8 workers ran the whole GPU suite in 121 s on an H200
    "tests": (420, gpu_tests("tests", "tests", workers=GPU_WORKERS)),
    "kernels": (300, "kernels --tokens 1,8,128,4096 --arms torch,exact,approx --dtypes bf16 --mode all "
                     "--repeats 50"),
    # approx RMSNorm at T=4096 alone (no other arm interleaved): the sweep's figure beside the tuner's
    "kernels-approx": (90, "kernels --ops rmsnorm --tokens 4096 --arms approx --dtypes bf16 --mode graph "
                           "--repeats 50"),
    "kernels-dtypes": (150, "kernels --tokens 1,128 --arms torch,exact,approx --dtypes fp16,fp32 "
                            "--mode graph --repeats 30"),
    # launch knobs of the fused kernels (exact one-launch norm, approx norm, SiLU*up): checked, then timed
    "tune": (400, "tune kernels --write-tuned --widths 2048 --tokens 1,8,128"),
    # T=1 only: the exact norm's configurations beside the floor, row-I/O and approx-norm ladder
    "tune-t1": (150, "tune kernels --parts exact --widths 2048 --tokens 1"),
    # the GPU tests where the exact norm path matters, after a tune stage changed the tuned file
    # (-n 8: pytest-xdist, carried as a wheel; spreads the Triton compiles of the validations over cores)
    "tests-norm": (300, gpu_tests("tests-norm", "tests/kernels/test_onelaunch_gpu.py",
                                  "tests/models/test_model_gpu.py", workers=GPU_WORKERS)),
    # approx norm only (one-row and persistent kernels) at T=4096, best written to the tuned file
    "tune-approx": (150, "tune kernels --parts approx --write-tuned"),
    # decode attention knobs per (batch, context), best written to the device's tuned file
    "attention": (150, "tune attention --write-tuned"),
    # eager vs graph prefill step per arm, arms and modes ABBA with the A/A arm torch#2
    "prefill": (180, "profile --bench prefill --rounds 8 --iters 3"),
    # per arm, one prefill step per prompt length (one prompt: the step is the prompt) in the engine's
    # default token-bucket graphs, the same step launched eagerly beside it, every plane's K/V of each
    # arm against torch's; ~2 minutes
    "prefill-arms": (300, "profile --bench prefill --batch 1 --lengths 512,2048,4096,8192 --rounds 4 "
                          "--iters 3"),
    "memcheck": (300, ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", PY,
                       str(ROOT / "scripts" / "memcheck_kernels.py")]),
    # model and engine decode steps ABBA with torch#2; --attribute: batch 1 in four engines (context
    # class x pool size), what moved the engine figure away from the profile's former 11.04 ms
    "decode": (360, "profile --bench decode --rounds 6 --iters 20 --attribute"),
    # the GPU tests of the measurement plumbing: ColdWork sees a real compile, the kernels headline is
    # plain with PDL beside it, the decode table and profile on the GPU
    "timing-tests": (300, gpu_tests("timing-tests", "tests/bench/test_warmth.py",
                                    "tests/kernels/test_bench_timing.py", "tests/kernels/test_bench_gpu.py",
                                    "tests/engine/test_engine_gpu.py", "tests/profiles/test_profile_gpu.py")),
    "profile": (200, "profile --model ouro-1.4b --batch 1 --context 512 --arms torch,exact,approx "
                     "--iters 100"),
    "profile-b128": (300, "profile --model ouro-1.4b --batch 128 --context 512 --arms torch,exact "
                          "--iters 20 --replays 1 --steps 1"),
    # batch 32: with batch 128, where the decode attention stands against its KV-bytes floor
    "profile-b32": (200, "profile --model ouro-1.4b --batch 32 --context 512 --arms torch,exact "
                         "--iters 20 --replays 1 --steps 1"),
    # Huginn (width 5280) at batch 1: the exact norm in one launch at every row count (the default),
    # then with the 3-launch path below 128 rows (the earlier routing), each beside its own torch arm
    "profile-huginn": (150, "profile --model huginn-0125 --batch 1 --context 512 --arms torch,exact "
                            "--iters 50"),
    "profile-huginn-3launch": (150, with_tuned(
        "profile-huginn-3launch", "norm_exact", {"wide_min_rows": 128},
        rlt("profile --model huginn-0125 --batch 1 --context 512 --arms torch,exact --iters 50",
            "profile-huginn-3launch"))),
    # Huginn's norms at width 5280 with exact's A/A copy: the routing's per-call figures
    "kernels-huginn": (300, "kernels --tokens 1,8,16,128,1024,2048,4096 "
                            "--ops rmsnorm_huginn,add_rmsnorm_huginn --arms torch,exact,approx,exact "
                            "--dtypes bf16 --mode all --repeats 30"),
    # the exact arm with the K/V write folded into its RoPE launch (the tuned ``rope_kv`` section): its
    # GPU tests (they switch the fusion on and off themselves), then the same profile as above with it on
    "fusekv-tests": (200, gpu_tests("fusekv-tests", "tests/engine/test_rope_kv_fused.py",
                                    "tests/engine/test_engine_gpu.py")),
    "profile-fusekv": (200, with_tuned("profile-fusekv", "rope_kv", {"enabled": True},
                                       rlt("profile --model ouro-1.4b --batch 1 --context 512 "
                                           "--arms torch,exact --iters 100", "profile-fusekv"))),
    # programmatic dependent launch (rltbench/kernels/pdl.py, the approx norm's large launches): GPU tests
    # (PDL kernels after a GEMM and after each other inside a graph), and the engine's arms
    "pdl-tests": (200, gpu_tests("pdl-tests", "tests/kernels/test_pdl_gpu.py",
                                 "tests/engine/test_engine_gpu.py")),
    "e2e": (330, f"e2e {OURO} --arms torch,exact,approx,torch --workload burst --concurrency 1,8,32,128 "
                 "--input-len 512 --output-len 128 --repeats 2 --deadline 310"),
    # the exact arm alone against torch with an A/A arm: the burst headline without the other arms' time
    "e2e-exact": (240, f"e2e {OURO} --arms torch,exact,torch --workload burst --concurrency 1,8,32,128 "
                       "--input-len 512 --output-len 128 --repeats 2 --deadline 210"),
    # the shipped preset, 3 interleaved repetitions with an A/A arm: identity under replay, warm cells
    "e2e-session": (240, f"e2e {OURO} --arms torch,exact,torch --workload session --trace mooncake-h200 "
                         "--max-requests 30 --repeats 3 --deadline 200"),
    # open-loop arrivals swept from the synchronous rate past the fastest arm's saturated probe, 3
    # interleaved repetitions with an A/A arm: each arm's SLO capacity with its interval, its ratio to
    # torch, one replay per rate. Cells of 3 synchronous request latencies (~4 s of arrivals at
    # 512 in / 64 out); on an H100 about 45 s of start and warm-up, ~23 s of probes (sync, a saturated
    # burst each for torch and exact), ~50-60 s per rate for 9 cells and 2 replays, more at the top rate
    # (~85 s: a saturating queue, a large replay): ~275 s in all, the deadline cutting the top rate
    # short rather than the stage's limit
    "e2e-rate": (330, f"e2e {OURO} --arms torch,exact,torch --workload rate --request-rate sweep "
                      "--sweep-rates 3 --cell-latencies 3 --repeats 3 --input-len 512 --output-len 64 "
                      "--slo ttft:500,tpot:25 --deadline 265"),
    # a Mooncake-format trace the user brings: records 6000-6039 of the shipped file, times rebased,
    # written into the run directory first so the input stays beside its results
    "e2e-session-trace": (240, ["bash", "-c", " ".join([
        "set -e; d=" + str(RESULTS / "e2e-session-trace") + "; mkdir -p $d;",
        PY, "-m", "rltbench.bench.trace_slice", "workloads/mooncake/conversation_trace.jsonl",
        "--start 6000 --count 30 --out $d/trace.jsonl; exec",
        *rlt(f"e2e {OURO} --arms torch,exact,torch --workload session --trace TRACE --repeats 3 "
             "--trace-length-scale 0.125 --trace-time-scale 0.5 --deadline 200", "e2e-session-trace"),
    ]).replace("TRACE", "$d/trace.jsonl")]),
    # Huginn-0125 sessions with the prefix cache off (torch, A/A torch#2) and on (torch+cache), ABBA over
    # 2 repetitions: output tok/s and TTFT on/off with the A/A spread, prefix-hit rates; the cache-on
    # schedule replayed untimed with the cache on and off under row-invariant prefill (the verdict on
    # the cache, docs/scenarios.md) and by every cache-off arm as recorded (information); 3
    # repetitions ran past a 250 s deadline on an H200 (commit dd971b0)
    "huginn-cache": (290, "e2e --model huginn-0125 --weights random --dtype bfloat16 --device cuda "
                          "--seed 0 --no-live --arms torch,torch --prefix-cache off,on "
                          "--workload session --trace multiturn-h200 --max-num-seqs 16 --repeats 2 "
                          "--deadline 250"),
    # Ouro-1.4B with its exit gate at 0.7 (random gates spread over all four loops there): tokens and
    # exit depths of the exact arm against torch under replay, mean depth per arm; the gate's GPU tests
    "exit-depths": (120, f"e2e {OURO} --arms torch,exact,torch --exit-threshold 0.7 --workload burst "
                         "--concurrency 1,8 --input-len 128 --output-len 32 --repeats 2 --deadline 90"),
    # the same load with the compute-saving exit (--exit-mode stop): decode steps stop their loops once
    # every row has exited; tokens and depths of exact against torch in this mode, loops run per step
    "exit-stop": (120, f"e2e {OURO} --arms torch,exact,torch --exit-threshold 0.7 --exit-mode stop "
                       "--workload burst --concurrency 1,8 --input-len 128 --output-len 32 --repeats 2 "
                       "--deadline 90"),
    # both exit modes in one interleaving (--exit-mode all,stop): every arm every loop and with the
    # compute-saving exit (NAME+stop, compared with torch+stop), ABBA over 3 repetitions, so each arm's
    # stop/all throughput ratio has the A/A spread beside it
    "exit-modes": (240, f"e2e {OURO} --arms torch,exact,torch --exit-threshold 0.7 --exit-mode all,stop "
                        "--workload burst --concurrency 1,8 --input-len 128 --output-len 32 --repeats 3 "
                        "--deadline 220"),
    # the decode step with every loop against the compute-saving step, interleaved in one process
    # (ABBA rounds, A/A copy): what the mode costs where no row exits early, and the step where they do
    "exit-stop-steps": (240, "profile --bench exit"),
    # row-invariant prefill on the GPU: a prompt's K/V alone or beside others, cache on/off replays
    "row-invariant-tests": (180, gpu_tests("row-invariant-tests", "tests/engine/test_row_invariant_gpu.py",
                                           report="-rA")),
    "exit-depths-tests": (120, gpu_tests("exit-depths-tests", "tests/engine/test_prefix_cache_and_exits.py",
                                         "tests/engine/test_exit_stop.py")),
    # the measurement-integrity checks on tiny models: identity by schedule replay, frozen timed cells
    # with cold-work counters, gsm8k chunk interleaving (engine, e2e, gsm8k GPU tests)
    "integrity-tests": (240, gpu_tests("integrity-tests", "tests/e2e/test_e2e_gpu.py",
                                       "tests/gsm8k/test_gsm8k_engine_e2e.py",
                                       "tests/engine/test_engine_gpu.py",
                                       "tests/kernels/test_bench_timing.py", workers="4")),
    # one repetition of the burst: first-request TTFT against later ones, cold cells, replay identity
    "e2e-quick": (200, f"e2e {OURO} --arms torch,exact,torch --workload burst --concurrency 1,8,32,128 "
                       "--input-len 512 --output-len 128 --repeats 1 --deadline 180"),
    # the native arm beside the Triton arms: its GPU tests (norm validation per dtype/width, >= 1e8
    # elements per dtype, strides/offsets/specials/empty, stream, graph replay, model forwards), the
    # kernels table with the four arms (every dtype), a decode-step profile and e2e bursts
    "native-tests": (420, gpu_tests("native-tests", "tests/kernels/test_native_gpu.py", workers="4")),
    "kernels-native": (300, "kernels --tokens 1,4096 --arms torch,exact,cuda,approx --dtypes bf16 "
                            "--mode all --repeats 30"),
    # every arm at decode and prefill row counts with the Liger peer column (carried wheel): the exact
    # and native norms beside Liger at T = 1, 8, 128, 4096, SiLU*up against the device copy
    "kernels-rows": (300, "kernels --tokens 1,8,128,4096 --ops rmsnorm,rmsnorm_residual,"
                          "add_rmsnorm_huginn,silu_mul --arms torch,exact,cuda,approx --dtypes bf16 "
                          "--mode all --repeats 30"),
    # the same-size copy beside every arm (with the Liger peer): how far each norm and SiLU*up is
    # from a plain streaming kernel of its own size, at one and 4096 rows
    "kernels-copy": (240, "kernels --tokens 1,4096 --ops rmsnorm,rmsnorm_residual,silu_mul "
                          "--arms torch,exact,cuda,approx --dtypes bf16 --mode all --repeats 30"),
    # the verdicts: every arm with A/A arms (torch#2, exact#2) and Liger at decode and prefill row
    # counts; each arm against torch, each kernel arm against exact, called within noise / faster /
    # slower; exact#2 shows how far the exact arm's own figures (% copy included) move run to run
    "kernels-verdicts": (330, "kernels --tokens 1,8,128,4096 --ops rmsnorm,rmsnorm_residual,"
                              "silu_mul --arms torch,exact,cuda,approx,torch,exact --dtypes bf16 "
                              "--mode all --repeats 40"),
    # the norms at 4096 x 2048 on five placements (inputs, outputs and graphs allocated anew, rounds
    # pooled): each placement's % copy beside the pooled one, exact's A/A copy and the Liger peer
    "kernels-placements": (240, "kernels --tokens 4096 --ops rmsnorm,rmsnorm_residual --arms "
                                "torch,exact,exact --dtypes bf16 --widths 2048 --mode graph --repeats 40 "
                                "--placements 5"),
    # the norms at 4096 x 2048 beside same-size and large copies: Nsight Compute counters of each
    # launch alone (L2 flushed) and back to back (the kernels command's graph of calls), and kernel
    # timestamps of that graph (duration, gap, period) (kernels --diagnose ncu); ~2 minutes
    "ncu-norm": (300, "kernels --diagnose ncu"),
    # what a slot leaves in L2 for the next one: the exact norm and the same-size copy at 4096 x 2048,
    # each replay timed alone after its twin, torch, the other, an L2 flush or an idle gap
    # (kernels --diagnose carryover); why each kernels slot starts from a flushed L2; ~1 minute
    "carryover": (150, "kernels --diagnose carryover"),
    # one row, L2-hot: the native norm against the Triton one with exact's own A/A copy (exact#2),
    # many rounds, for a difference of a few hundredths of a microsecond
    "kernels-t1": (150, "kernels --tokens 1 --ops rmsnorm,rmsnorm_residual --arms "
                        "torch,exact,cuda,approx,exact --dtypes bf16 --mode hot --repeats 400"),
    "kernels-native-dtypes": (240, "kernels --tokens 1,128 --arms torch,exact,cuda,approx --dtypes "
                                   "fp16,fp32 --mode graph --repeats 30"),
    "profile-native": (300, "profile --model ouro-1.4b --batch 1 --context 512 "
                            "--arms torch,exact,approx,cuda --iters 100"),
    "e2e-native": (420, f"e2e {OURO} --arms torch,exact,approx,cuda,torch --workload burst "
                        "--concurrency 1,8,32,128 --input-len 512 --output-len 128 --repeats 2 "
                        "--deadline 380"),
    "gsm8k": (200, "gsm8k --model ouro-1.4b --weights random --arms torch,exact,approx,torch --gate 1.0 "
                   "--limit 48 --max-gen-toks 256 --batch-size 16 --device cuda"),
    # `rltbench serve` on CUDA: graphs captured before listening, a burst over HTTP, ids as in-process
    "serve-tests": (200, gpu_tests("serve-tests", "tests/serve/test_serve_gpu.py")),
    # Ouro-1.4B exact behind `rltbench serve`: e2e bursts over HTTP vs in-process, 10 C=128 bursts with
    # every KV block back, guidellm (carried in .whl/peer) on the same load: table.md (serve_bench.sh)
    "serve": (560, ["env", f"PY={PY}", "REPEATS=1", "SOAK=10", "bash",
                    str(ROOT / "scripts" / "serve_bench.sh"), str(RESULTS / "serve")]),
    # the open-loop cross-check on one `rltbench serve` (exact arm): rltbench e2e --workload rate and
    # guidellm's constant profile at 2, 4 and 8 requests/s, 80 requests of 512/128 tokens per rate
    # each; achieved rate within 2%, TTFT and TPOT p50 within 5% (rate_check.md); ~4 minutes
    "serve-rate": (480, ["env", f"PY={PY}", "STEPS=rate", "RATES=2,4,8", "RATE_REQUESTS=80",
                         "RATE_ARRIVALS=constant", "bash", str(ROOT / "scripts" / "serve_bench.sh"),
                         str(RESULTS / "serve-rate")]),
    # prefill/decode disaggregation (docs/pd.md) on nvidia-h200-x2: prefill on cuda:0, decode on cuda:1,
    # each request's KV (every plane) one NCCL message, against the colocated exact engine on cuda:0;
    # one stage per model and KV layout (each fits one 10-minute call), --deadline keeps finished cells
    # KV capacity per model and layout at an 8 GiB KV budget, with a burst at the largest C of each
    # engine row (Ouro 37, Huginn full 10, compress 176 requests of 256+32 tokens); ~90 s
    "capacity": (240, "capacity --models ouro-1.4b,huginn-0125 --kv-layouts full,compress --memory-gib 8 "
                      "--input-len 256 --output-len 32 --burst --arms torch --repeats 1 --dtype bfloat16 "
                      "--device cuda --seed 0"),
    # long prompts: packed against one-request-per-step prefill, 4 prompts of 2048 and 4092 tokens (Huginn's
    # longest with 4 generated), A/A copy of the packed policy; eager prefill steps (a graph saves nothing
    # at thousands of tokens per step and its capture would double the warm-up); ~90 s
    "prefill-long": (240, "prefill --models ouro-1.4b,huginn-0125 --input-lens 2048,4092 --concurrency 4 "
                          "--output-len 4 --repeats 2 --max-num-batched-tokens 8192 --arms torch "
                          "--no-prefill-graphs --dtype bfloat16 --device cuda --seed 0"),
    "pd": (420, f"pd {PD} --model ouro-1.4b --devices cuda:0,cuda:1 --deadline 330"),
    "pd-huginn": (570, f"pd {PD} --model huginn-0125 --kv-layout full --devices cuda:0,cuda:1 "
                       "--deadline 450"),
    "pd-huginn-compress": (480, f"pd {PD} --model huginn-0125 --kv-layout compress "
                                "--devices cuda:0,cuda:1 --deadline 380"),
    # the same path with both processes on one GPU (gloo staged through host memory: NCCL refuses two
    # ranks on one device), smaller
    "pd-1gpu": (300, "pd --model ouro-1.4b --weights random --dtype bfloat16 --arm exact --devices "
                     "cuda:0,cuda:0 --concurrency 1,8 --input-len 512 --output-len 64 --repeats 2 "
                     "--deadline 230"),
    # pd's GPU tests: pack/unpack on the device, one GPU over gloo; two GPUs over NCCL and a peer killed
    # mid-transfer over NCCL (these skip on a one-GPU machine)
    "pd-tests": (300, gpu_tests("pd-tests", "tests/pd", report="-rfEs")),
})


BASE_ARCHIVE = ROOT / ".base.tgz"
BASE_ROOT = Path(tempfile.gettempdir()) / "rltbench-base"


def stage_run(name: str) -> tuple[str, int, list[str], Path, dict[str, str]]:
    """(directory name, time limit, command, working tree, extra environment) of a stage. `STAGE@base`:
    STAGE's command run from the baseline tree (`.base.tgz`, unpacked once into BASE_ROOT) with its
    result directory renamed STAGE-base and the baseline's commit in its provenance."""
    stage = name.removesuffix("@base")
    limit, cmd = STAGES[stage]
    if stage == name:
        return name, limit, cmd, ROOT, {}
    if not BASE_ROOT.is_dir():
        BASE_ROOT.mkdir(parents=True)
        subprocess.run(["tar", "xzf", str(BASE_ARCHIVE), "-C", str(BASE_ROOT)], check=True)
    sha = subprocess.run(["git", "get-tar-commit-id"], input=gzip.decompress(BASE_ARCHIVE.read_bytes()),
                         capture_output=True, check=False).stdout.decode().strip() or "unknown"
    out = f"{stage}-base"
    swap = {str(RESULTS / stage): str(RESULTS / out), str(ROOT / "scripts"): str(BASE_ROOT / "scripts")}
    return out, limit, [swap.get(c, c) for c in cmd], BASE_ROOT, {"RLTBENCH_GIT_SHA": sha}


def install_carried_wheels() -> None:
    """The GPU box has no network: lm-eval and its few missing dependencies travel as wheels in
    .whl/ (see README, "GPU runs"); install them into SITE when lm_eval is not importable."""
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        if wheels:
            subprocess.run([PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--target", str(SITE), *map(str, wheels)], check=False)
            os.environ["PYTHONPATH"] = f"{SITE}:{os.environ.get('PYTHONPATH', '')}"


def run_stage(name: str, limit: int, cmd: list[str], results: Path = RESULTS, cwd: Path = ROOT,
              extra_env: dict[str, str] | None = None) -> dict:
    """Run one stage into results/<name> (emptied first) from the tree `cwd`: its suite.json entry."""
    out_dir = results / name
    if out_dir.exists():  # a stage's directory holds one run: never mix rows of two runs
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "stage.log"
    t0 = time.time()
    print(f"=== {name} (limit {limit}s): {' '.join(cmd)}", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=f"{cwd}:{os.environ.get('PYTHONPATH', '')}",
               **(extra_env or {}))
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=limit,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    secs = round(time.time() - t0, 1)
    finalize_manifest(out_dir, name, limit, cmd, rc)
    make_portable(out_dir, PORTABLE)
    print(log.read_text(errors="replace")[-1500:], flush=True)
    print(f"=== {name}: rc={rc} in {secs}s", flush=True)
    return {"stage": name, "rc": rc, "seconds": secs, "command": [portable_text(c, PORTABLE) for c in cmd]}


def final_status(rc: int | str) -> str:
    """A stage's status from how its process ended: a time limit interrupts, a non-zero exit fails."""
    if rc == "timeout":
        return "interrupted"
    return "complete" if rc == 0 else "failed"


def finalize_manifest(out_dir: Path, name: str, limit: int, cmd: list[str], rc: int | str) -> None:
    """Leave the stage directory with a manifest in a final status: write one (provenance of this
    process, the stage's command) where the command wrote none; where it left "running" (killed at
    the time limit, crashed), set the status from the exit and say so."""
    mf = out_dir / "manifest.json"
    status = final_status(rc)
    if not mf.is_file():
        files = sorted(p.name for p in out_dir.iterdir() if p.is_file())
        run = RunDir.create(name, out_dir, argv=cmd, config={"stage": name, "time_limit_s": limit})
        run.update_manifest(status=status, exit_code=rc, files=files,
                            written_by="scripts/gpu_suite.py (the stage's command writes no run directory)")
        return
    manifest = json.loads(mf.read_text())
    if manifest.get("status") == "running":
        manifest["status_corrected"] = {"was": "running", "why": f"set by scripts/gpu_suite.py: the command "
                                        f"exited (rc {rc}) without a final status"}
        manifest["status"] = status
        atomic_write_text(mf, dumps(manifest) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", help="stages to run (default: all)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for name, (limit, cmd) in STAGES.items():
            print(f"{name:15s} {limit:4d}s  {' '.join(cmd)}")
        return 0
    names = args.stages or list(STAGES)
    unknown = [n for n in names if n.removesuffix("@base") not in STAGES]
    if unknown:
        print(f"unknown stage(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    if any(n.endswith("@base") for n in names) and not BASE_ARCHIVE.is_file():
        print("a STAGE@base stage needs .base.tgz (git archive -o .base.tgz REV ...)", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    install_carried_wheels()
    summary_path = RESULTS / "suite.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"runs": []}
    for name in names:
        out, limit, cmd, cwd, extra = stage_run(name)
        summary["runs"].append(run_stage(out, limit, cmd, cwd=cwd, extra_env=extra))
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
