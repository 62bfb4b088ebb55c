"""benchmarks/gpu.sh runs every benchmark's device path; on CPU at its quick budget here."""
import csv
import os
import queue
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_prefetch  # noqa: E402
from torchrl_seqchunk.recipes.common.loopback import loopback_store  # noqa: E402


def gpu_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHON": sys.executable})


def test_gpu_script_on_cpu_writes_every_figure(tmp_path):
    result = gpu_sh("--device", "cpu", "--quick", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = {(r["bench"], r["name"]): float(r["value"]) for r in csv.DictReader(open(tmp_path / "ratios.csv"))}
    for bench, name in [("recurrent", "resetrnn_vs_gru_noreset"), ("recurrent", "resetrnn_lstm_vs_lstm_noreset"),
                        ("recurrent", "resetrnn_packed_vs_gru_noreset"), ("prefetch", "trainer_wait_fraction"),
                        ("prefetch", "prefetch_speedup"), ("main_job", "main_job_fps")]:
        assert figures[bench, name] > 0, (bench, name)
        assert f"RATIO {name} " in result.stdout or name == "main_job_fps"
    assert 0 <= figures["prefetch", "trainer_wait_fraction"] <= 1
    report = (tmp_path / "report.md").read_text()
    assert "- device: cpu (" in report and "- failed: none" in report and "| prefetch | trainer_wait_fraction |" in report
    rows = list(csv.DictReader(open(tmp_path / "prefetch" / "prefetch.csv")))
    assert {"step_ms_prefetched", "step_ms_inline", "copy_GBps"} <= {r["name"] for r in rows}
    frames = [int(r["frames"]) for r in csv.DictReader(open(tmp_path / "main_job" / "metrics.csv"))]
    assert frames[-1] == 256  # one rollout of 8 envs x 32 steps


def test_gpu_script_refuses_a_missing_device_and_unknown_arguments(tmp_path):
    if not torch.cuda.is_available():
        result = gpu_sh("--device", "cuda", "--out", str(tmp_path))
        assert result.returncode == 2 and "--device cuda but torch sees no CUDA device" in result.stderr
    result = gpu_sh("--frames", "3")
    assert result.returncode == 2 and "unknown argument --frames" in result.stderr


def test_ddp_learner_rank_trains_from_its_prefetcher():
    # the NCCL learners' code path, one gloo rank in this process (gpu.sh runs it with 2+ GPUs)
    args = bench_prefetch.parse_args(["--quick", "--train-steps", "2"])
    store, results = loopback_store(), queue.SimpleQueue()
    bench_prefetch.ddp_rank(0, 1, store.port, args, results)
    assert results.get(timeout=1) > 0  # chunks per second
    assert not torch.distributed.is_initialized()


def test_prefetch_moves_atari_sized_chunks():
    args = bench_prefetch.parse_args(["--quick"])
    chunk = bench_prefetch.make_buffer(args, seed=0).sample()
    assert chunk["observation"].shape == (16, 64, 1, 64, 64) and chunk["observation"].dtype == torch.uint8
    assert chunk["is_first"].shape == (16, 64, 1)  # what the learner's ResetRNN resets on
