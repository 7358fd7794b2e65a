"""pd on GPUs: pack/unpack bit-exact on the device, two processes sharing one GPU (gloo, host-staged)
and two GPUs over NCCL (tokens equal to the colocated replay, blocks back), and a peer killed mid-transfer
over NCCL. Run with --run-gpu; the two-GPU tests skip on one GPU."""

from __future__ import annotations

import pytest
import torch

from rltbench.cli import main
from rltbench.engine.kv_transfer import pack_blocks, unpack_blocks
from rltbench.engine.paged_context import allocate_kv_pool
from rltbench.results import RunDir
from tests.pd.test_pd_processes import peers

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs"
)


def test_pack_unpack_bit_exact_on_gpu() -> None:
    dev = torch.device("cuda")
    src = allocate_kv_pool(96, 12, 16, 4, 16, torch.bfloat16, dev)
    raw = src.view(torch.int16)
    raw.copy_(torch.randint(-(2**15), 2**15 - 1, raw.shape, dtype=torch.int16, device=dev))
    dst = allocate_kv_pool(96, 10, 16, 4, 16, torch.bfloat16, dev)
    packed = pack_blocks(src, [7, 1, 11], extra_bytes=16)
    unpack_blocks(dst, [0, 9, 4], packed[:-16])
    for s, d in ((7, 0), (1, 9), (11, 4)):
        assert torch.equal(dst[:, :, d].view(torch.int16), src[:, :, s].view(torch.int16))


def _pd(tmp_path, devices: str, *args: str) -> RunDir:
    out = tmp_path / "run"
    rc = main(
        [
            "pd",
            "--model",
            "ouro-tiny",
            "--devices",
            devices,
            "--concurrency",
            "1,4",
            "--input-len",
            "40",
            "--output-len",
            "8",
            "--repeats",
            "1",
            "--probe-reps",
            "2",
            "--result-dir",
            str(out),
            *args,
        ]
    )
    run = RunDir.open(out)
    assert rc == 0 and run.manifest["status"] == "complete", run.manifest.get("ranks")
    assert run.manifest["all_blocks_free"] == {"prefill": True, "decode": True}
    replays = run.read_jsonl("replay.jsonl")
    assert replays and all(r["identical"] == r["compared"] > 0 for r in replays)
    return run


def test_two_processes_on_one_gpu_over_gloo(tmp_path) -> None:
    run = _pd(tmp_path, "cuda:0,cuda:0")
    assert run.read_json("link_probe.json")["transport"] == "gloo (host-staged)"


@two_gpus
def test_two_gpus_over_nccl(tmp_path) -> None:
    run = _pd(tmp_path, "cuda:0,cuda:1", "--backend", "nccl")
    assert run.read_json("link_probe.json")["transport"] == "nccl"
    assert run.manifest["multicast_env"]["decode"]["NCCL_NVLS_ENABLE"] == "0"


@two_gpus
@pytest.mark.parametrize("victim", ["prefill", "decode"])
def test_a_peer_killed_mid_transfer_over_nccl(victim) -> None:
    p, d = peers({1: f"kill_{victim}"}, timeout=5.0, C=3, devices=["cuda:0", "cuda:1"], backend="nccl")
    dead, alive = (p, d) if victim == "prefill" else (d, p)
    assert dead["rc"] == -9
    lines = alive["stderr"].strip().splitlines()
    assert alive["rc"] == 3 and lines[-1].endswith("every KV block returned"), alive["stderr"]
