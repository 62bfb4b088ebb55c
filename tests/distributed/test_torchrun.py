"""seqchunk distributed-ppo started as torchrun starts it: one process per learner rank,
joining the group through env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the
agent's store (TORCHELASTIC_USE_AGENT_STORE). The agent's store is served here, on the
loopback, in place of torchrun's (which listens on every interface)."""
import csv
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import is_loopback, listening_addresses, marked_processes

from torchrl_seqchunk.recipes.common.loopback import loopback_store

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTED_PPO = [sys.executable, "-m", "torchrl_seqchunk.recipes", "distributed-ppo"]  # seqchunk distributed-ppo


def rank_env(rank: int, world: int, port: int, marker: str) -> dict:
    """The environment torchrun gives rank ``rank`` of ``world`` on one node."""
    name, value = marker.split("=")
    return {**os.environ, name: value, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RUN_ID": "test", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads processes and sockets from Linux's /proc")
def test_two_ranks_started_as_torchrun_starts_them_learn_together(tmp_path):
    store = loopback_store()
    marker = f"SEQCHUNK_TORCHRUN_TEST={tmp_path.name}"
    command = [*DISTRIBUTED_PPO, "--workers", "2",
               "--total-frames", "512", "--num-envs", "2", "--epochs", "2", "--no-progress",
               "--runs-dir", str(tmp_path), "--name", "run"]
    ranks, addresses = [], set()
    try:
        for rank in range(2):
            with open(tmp_path / f"out{rank}.txt", "w") as out:
                ranks.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                              env=rank_env(rank, 2, store.port, marker), start_new_session=True))
        deadline = time.monotonic() + 300
        while any(r.poll() is None for r in ranks):
            assert time.monotonic() < deadline, "the ranks were still running after 300 s"
            addresses |= listening_addresses(marked_processes(marker))
            time.sleep(0.5)
    finally:
        for run in ranks:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    logs = [(tmp_path / f"out{rank}.txt").read_text() for rank in range(2)]
    assert [r.returncode for r in ranks] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert addresses and all(is_loopback(a) for a in addresses), sorted(map(str, addresses))
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # 2 workers (one per rank) x 2 envs x 32 steps = 128 frames per iteration -> 4 iterations
    assert [int(r["frames"]) for r in rows] == [128, 256, 384, 512]
    assert all(math.isfinite(float(r["loss_objective"])) for r in rows)
    assert "final_return" in logs[0] and "final_return" not in logs[1]  # rank 0 reports


def test_learners_other_than_the_torchrun_world_size_and_a_ray_cluster_of_its_own_are_refused():
    env = rank_env(0, 3, 1, "SEQCHUNK_TORCHRUN_TEST=refused")
    result = subprocess.run([*DISTRIBUTED_PPO, "--learners", "4"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 2
    assert "--learners 4, but torchrun started 3 ranks (WORLD_SIZE)" in result.stderr
    result = subprocess.run([*DISTRIBUTED_PPO, "--engine", "ray",
                             "--workers", "3"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 2 and "under torchrun, --engine ray joins a running Ray cluster" in result.stderr
