import re
import threading
import time

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv, StepCounter, TransformedEnv
from waiting import wait_for  # tests/waiting.py

from torchrl_seqchunk import IngestThread, StreamChunkSampler, TagTrajectories

TRAJ = ("collector", "traj_ids")


def cartpole_collector(worker: int, num_workers: int, total_frames: int) -> Collector:
    """Random CartPole steps with their step in the episode ("step_count", 0 at a start),
    trajectory ids tagged with the worker."""
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.set_seed(worker)
    return Collector(env, None, frames_per_batch=20, total_frames=total_frames,
                     postproc=TagTrajectories(worker, num_workers))


@pytest.mark.distributed
def test_two_collectors_feed_one_buffer_across_ring_wraps_without_stitching():
    capacity, frames, batches = 200, 600, 30  # each writer: 30 batches of 20 steps
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=StreamChunkSampler(4, 8, traj_key=TRAJ, seed=0),
        batch_size=32,
    )
    collectors = [cartpole_collector(w, 2, frames) for w in range(2)]
    ingests = [IngestThread(c, rb) for c in collectors]
    previous = [None] * 4  # each stream's last step: (trajectory, step in episode)
    stitched = wrong_first = starts = continued = chunks = 0
    seen_workers = set()
    try:
        for ingest in ingests:
            ingest.wait(3, timeout=60)  # a whole episode to draw
        while min(ingest.batches for ingest in ingests) < batches:
            chunk = rb.sample()  # while both threads write
            chunks += 1
            traj, step = chunk[TRAJ].tolist(), chunk["step_count"][..., 0].tolist()
            first = chunk["is_first"][..., 0].tolist()
            for b in range(4):
                for t in range(8):
                    here = (traj[b][t], step[b][t])
                    seen_workers.add(here[0] % 2)
                    if first[b][t]:
                        starts += 1
                        wrong_first += here[1] != 0  # is_first only at an episode's step 0
                    else:  # the same trajectory, one step on (across chunks too)
                        continued += t == 0
                        stitched += previous[b] is None or here != (previous[b][0], previous[b][1] + 1)
                    previous[b] = here
            for ingest in ingests:
                ingest.check()
        for ingest in ingests:
            ingest.wait(batches, timeout=60)
    finally:
        for ingest in ingests:
            ingest.close()
        for collector in collectors:
            collector.shutdown()
    assert sum(ingest.frames for ingest in ingests) == 2 * frames == 6 * capacity  # 6 wraps
    assert stitched == 0 and wrong_first == 0
    assert chunks > 10 and starts > 0 and continued > 0 and seen_workers == {0, 1}


def batches_of(n: int, pulled: list, fail_at: int | None = None):
    """``n`` batches of 4 steps [2 envs, 2] (one episode per env); counts them in
    ``pulled``; raises at batch ``fail_at``."""
    done = torch.tensor([[False, True]] * 2).unsqueeze(-1)
    for i in range(n):
        if i == fail_at:
            raise KeyError("the env crashed")
        pulled.append(i)
        yield TensorDict({"obs": torch.full((2, 2), float(i)), ("next", "done"): done}, [2, 2])


def buffer():
    return TensorDictReplayBuffer(storage=LazyTensorStorage(50), sampler=StreamChunkSampler(1, 2),
                                  batch_size=2)


def ingest_threads() -> int:
    return sum(thread.name == "IngestThread" for thread in threading.enumerate())


def parked_or_ended(ingest) -> bool:
    """The thread waits for a request (on demand), or has ended."""
    with ingest._changed:
        return bool(ingest._changed._waiters) or ingest._finished


@pytest.mark.distributed
def test_on_demand_pace_transform_and_end():
    pulled, rb = [], buffer()
    before = ingest_threads()

    def double(batch):
        return batch.set("obs", batch["obs"] * 2)

    with IngestThread(batches_of(5, pulled), rb, transform=double, on_demand=True) as ingest:
        assert ingest_threads() == before + 1
        with pytest.raises(TimeoutError, match="0 of 1 batches written after 0.2 s"):
            ingest.wait(1, timeout=0.2)  # nothing asked for: nothing collected
        assert pulled == []
        ingest.request()
        ingest.wait(1, timeout=10)
        # the thread has decided on its next batch: it waits for a request (or it ran on)
        wait_for(lambda: parked_or_ended(ingest), "the thread waits for the next request")
        assert pulled == [0] and (ingest.batches, ingest.frames, len(rb)) == (1, 4, 4)
        ingest.request(4)
        ingest.wait(5, timeout=10)
        # written flat, env after env, through the transform
        assert rb.storage[:]["obs"].tolist() == [2 * i for i in range(5) for _ in range(4)]
        ingest.request()
        with pytest.raises(RuntimeError, match="the collector ended after 5 batches, before the 6"):
            ingest.wait(6, timeout=10)
    assert ingest_threads() == before  # joined


@pytest.mark.distributed
def test_close_stops_an_endless_collector_and_errors_reach_the_learner():
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    collector = Collector(env, None, frames_per_batch=20, total_frames=-1)  # never ends
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                sampler=StreamChunkSampler(1, 4, traj_key=TRAJ), batch_size=4)
    before = ingest_threads()
    ingest = IngestThread(collector, rb)
    ingest.wait(2, timeout=60)
    start = time.monotonic()
    ingest.close(timeout=10)
    assert time.monotonic() - start < 10 and ingest_threads() == before
    written = ingest.frames
    collector.shutdown()
    assert written >= 40 and len(rb) == min(written, 100)

    pulled = []
    ingest = IngestThread(batches_of(5, pulled, fail_at=2), buffer())
    with pytest.raises(KeyError, match="the env crashed"):
        ingest.wait(3, timeout=10)
    assert ingest.batches == 2
    ingest.close()  # already raised: closes quietly
    ingest = IngestThread([torch.zeros(3)], buffer())
    wait_for(lambda: ingest._finished, "the thread fails on the tensor")  # before close stops it
    with pytest.raises(TypeError, match="the collector yielded a Tensor, not a TensorDict"):
        ingest.close()  # not raised yet: close raises it


def test_bad_arguments():
    with pytest.raises(TypeError, match="collector must be iterable"):
        IngestThread(3, buffer())
    with pytest.raises(TypeError, match=r"buffer must be a TorchRL ReplayBuffer \(e.g. TensorDictReplayBuffer\), got list"):
        IngestThread([], [])
    with pytest.raises(TypeError, match="transform must be callable or None, got int"):
        IngestThread([], buffer(), transform=1)
    with IngestThread([], buffer()) as ingest, pytest.raises(ValueError, match="collects freely"):
        ingest.request()
    with IngestThread([], buffer(), on_demand=True) as ingest:
        with pytest.raises(ValueError, match="batches must be >= 1, got 0"):
            ingest.request(0)
        for bad, kind in [("2", "str"), (1.5, "float"), (True, "bool")]:
            for call in (ingest.request, ingest.wait):
                with pytest.raises(TypeError, match=re.escape(f"batches must be an int, got {bad!r} ({kind})")):
                    call(bad)
        with pytest.raises(TypeError, match=r"timeout must be a real number, got '1' \(str\)"):
            ingest.wait(1, timeout="1")
        # NaN waited forever, inf and 1e20 overflowed inside threading
        for bad in (float("nan"), float("inf"), 1e20, -1.0):
            for call in (lambda: ingest.wait(1, timeout=bad), lambda: ingest.close(timeout=bad)):
                with pytest.raises(ValueError, match="timeout must be .* Pass seconds to wait"):
                    call()


def test_close_without_a_time_limit():
    ingest = IngestThread([], buffer())
    ingest.close(timeout=None)
    assert not ingest._thread.is_alive()


def test_an_empty_batch_is_counted_and_writes_nothing():
    empty = TensorDict({"obs": torch.zeros(0, 3, dtype=torch.long), ("next", "done"): torch.zeros(0, 3, 1, dtype=torch.bool)},
                       [0, 3])
    full = TensorDict({"obs": torch.arange(3).view(1, 3), ("next", "done"): torch.tensor([[[0], [0], [1]]]).bool()},
                      [1, 3])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), sampler=StreamChunkSampler(1, 3, seed=0), batch_size=3)
    with IngestThread([empty, full], rb) as ingest:
        ingest.wait(2, timeout=30)
        assert (ingest.batches, ingest.frames, len(rb)) == (2, 3, 3)
    assert rb.sample()["obs"].tolist() == [[0, 1, 2]]


def test_a_failed_thread_fails_every_later_call():
    ingest = IngestThread(batches_of(5, [], fail_at=2), buffer())
    with pytest.raises(KeyError, match="the env crashed"):
        ingest.wait(3, timeout=10)
    for call in (lambda: ingest.wait(3, timeout=10), lambda: ingest.wait(1), ingest.check):
        with pytest.raises(RuntimeError, match="the ingest thread failed earlier: KeyError: 'the env crashed'") as raised:
            call()  # not "the collector ended after 2 batches", nor silence
        assert isinstance(raised.value.__cause__, KeyError)
    ingest.close()  # already raised: closes quietly
    assert ingest.batches == 2


def test_a_transform_that_returns_no_tensordict_is_named():
    def in_place(batch):  # edits the batch, forgets to return it
        batch["obs"] *= 2

    for transform, got in [(in_place, "None"), (lambda batch: batch["obs"], "Tensor")]:
        ingest = IngestThread(batches_of(2, []), buffer(), transform=transform)
        with pytest.raises(TypeError, match=f"transform must return a TensorDict, got {got}"):
            ingest.wait(1, timeout=10)
        ingest.close()
        assert ingest.batches == 0


def test_padding_of_split_trajectories_is_not_written():
    # a split_trajs batch: trajectory 5 of 3 steps, trajectory 6 of 1 step padded to 3
    mask = torch.tensor([[True, True, True], [True, False, False]])
    batch = TensorDict({"obs": torch.tensor([[0, 1, 2], [3, 0, 0]]),
                        TRAJ: torch.tensor([[5, 5, 5], [6, 0, 0]]),
                        ("collector", "mask"): mask,
                        ("next", "done"): torch.tensor([[0, 0, 1], [1, 0, 0]]).bool().unsqueeze(-1)},
                       [2, 3])
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20),
                                sampler=StreamChunkSampler(1, 2, traj_key=TRAJ, seed=0), batch_size=2)
    with IngestThread([batch, batch], rb, on_demand=True) as ingest:
        ingest.request(2)
        ingest.wait(2)
        assert (ingest.batches, ingest.frames, len(rb)) == (2, 8, 8)  # 4 real steps a batch
    assert rb.storage[:]["obs"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert rb.storage[:][TRAJ].tolist() == [5, 5, 5, 6, 5, 5, 5, 6]


def test_a_collector_with_split_trajs_writes_only_its_env_frames():
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    with pytest.warns(UserWarning, match="split_trajs=True produces a .* zero-padded tensordict"):
        collector = Collector(env, None, frames_per_batch=20, total_frames=100, split_trajs=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(200),
                                sampler=StreamChunkSampler(1, 4, traj_key=TRAJ, seed=0), batch_size=4)
    try:
        with IngestThread(collector, rb) as ingest:
            ingest.wait(5, timeout=60)
            assert (ingest.batches, ingest.frames, len(rb)) == (5, 100, 100)  # 5 batches of 20
    finally:
        collector.shutdown()
    assert rb.storage[:]["collector", "mask"].all()
