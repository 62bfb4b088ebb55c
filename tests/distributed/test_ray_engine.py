"""seqchunk distributed-ppo --engine ray: env workers as Ray actors of a local cluster that
binds the loopback only and is gone, every process of it, when the run ends."""
import csv
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from processes import is_loopback, listening_addresses, marked_processes

pytest.importorskip("ray", reason="the distributed extra is not installed")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads processes and sockets from Linux's /proc")
def test_ray_engine_on_two_learners_and_two_workers_binds_the_loopback_and_leaves_no_process(tmp_path):
    # a Ray temp dir of this run only (short: Ray's socket paths have a length limit); every
    # process of the run, learners and Ray's own, inherits it and is found by it
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    marker = f"RAY_TMPDIR={ray_tmp}"
    env = {**os.environ, "RAY_TMPDIR": ray_tmp,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torchrl_seqchunk.recipes", "distributed-ppo", "--engine", "ray",
               "--learners", "2", "--workers", "2", "--total-frames", "512", "--num-envs", "2",
               "--epochs", "2", "--no-progress", "--runs-dir", str(tmp_path), "--name", "run"]
    names, addresses = set(), set()
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        run = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while run.poll() is None:  # what runs, and where it listens, while the job runs
            assert time.monotonic() < deadline, "the run was still going after 400 s"
            processes = marked_processes(marker)
            names.update(processes.values())
            addresses |= listening_addresses(processes)
            time.sleep(0.5)
        left = marked_processes(marker)
        for _ in range(20):  # Ray's processes end within moments of ray.shutdown()
            if not left:
                break
            time.sleep(0.5)
            left = marked_processes(marker)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for pid in marked_processes(marker):  # whatever this run left, not to disturb later tests
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert run.returncode == 0, (tmp_path / "err.txt").read_text()[-3000:]
    assert left == {}, f"processes of the run still alive after it ended: {left}"
    # the cluster was really there: its control processes and the workers' actors
    assert {"raylet", "gcs_server"} <= names and any(n.startswith("ray::Collector") for n in names), names
    assert addresses and all(is_loopback(a) for a in addresses), sorted(map(str, addresses))

    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # 2 workers x 2 envs x 32 steps = 128 frames per iteration, both ranks together -> 4 iterations
    assert [int(r["frames"]) for r in rows] == [128, 256, 384, 512]
    for row in rows:
        for key in ("loss_objective", "loss_critic", "return_mean"):
            assert math.isfinite(float(row[key])), (key, row)
        # the mean of the last min(episodes, 20) raw CartPole returns, each a whole number of steps
        # survived, at least 1: their sum is a whole number >= the count (a scaled or normalized
        # reward logged in its place would not be)
        count = min(int(row["episodes"]), 20)
        total = float(row["return_mean"]) * count
        assert abs(total - round(total)) < 1e-6 and total >= count, row
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    assert "final_return" in (tmp_path / "out.txt").read_text()
