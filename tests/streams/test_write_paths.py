"""StreamChunkSampler under TorchRL's write paths: writes it did not see, pickling."""
import functools
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing  # noqa: F401  (registers its tensor reductions)
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_seqchunk import StreamChunkSampler


def episodes(lengths, first_obs=0):
    """Steps of consecutive episodes; "obs" counts steps from ``first_obs``."""
    done = []
    for length in lengths:
        done += [False] * (length - 1) + [True]
    n = len(done)
    return TensorDict(
        {"obs": torch.arange(first_obs, first_obs + n),
         ("next", "done"): torch.tensor(done).reshape(n, 1)},
        [n],
    )


def buffer(num_streams=1, seq_len=4, capacity=100, storage=None, **kwargs):
    sampler = StreamChunkSampler(num_streams, seq_len, seed=0, **kwargs)
    return TensorDictReplayBuffer(
        storage=storage if storage is not None else LazyTensorStorage(capacity),
        sampler=sampler, batch_size=num_streams * seq_len,
    )


UNSEEN = "did not see every write into its storage"
LAYOUT = r"calls rb\.extend with everything written, e\.g\. an ingest thread"


def test_a_write_through_the_writer_alone_is_named_at_the_next_sample():
    rb = buffer()
    rb.extend(episodes([3, 5]))  # 8 steps the sampler was told of
    rb.sample()
    rb._writer.extend(episodes([4], first_obs=8))  # 4 steps it was not
    for _ in range(2):  # the writes stay unseen: a retry says the same
        with pytest.raises(ValueError, match=UNSEEN) as error:
            rb.sample()
        assert "the writers count 4 more step(s) written than the 8 the sampler was told of" in str(error.value)
        assert "replay_buffer=" in str(error.value)
    with pytest.raises(ValueError, match=LAYOUT):
        rb.sample()
    rb.empty()  # starts over
    rb.extend(episodes([4]))
    assert rb.sample()["obs"].tolist() == [[0, 1, 2, 3]]


def test_writes_through_the_writer_before_the_first_sample_are_named_too():
    # A multi-process collector given replay_buffer= writes with the buffer's own writer
    # from the start: nothing was told to the sampler, its clock is 0.
    rb = buffer()
    rb._writer.extend(episodes([3, 5]))
    with pytest.raises(ValueError, match=r"count 8 more step\(s\) written than the 0 the"):
        rb.sample()


def test_a_write_into_the_storage_alone_is_named_by_its_slot():
    rb = buffer()
    rb.extend(episodes([3, 5]))  # slots 0-7, the last written is 7
    rb._storage.set(torch.arange(8, 12), episodes([4], first_obs=8))
    with pytest.raises(ValueError, match=UNSEEN) as error:
        rb.sample()
    assert "the storage's last written slot is 11, the last slot written through the buffer is 7" in str(error.value)


def test_another_buffer_on_the_storage_may_fill_it_first_but_not_write_after():
    storage = LazyTensorStorage(100)
    other = TensorDictReplayBuffer(storage=storage)
    other.extend(episodes([3]))  # before the sampler's first look: a filled storage
    rb = buffer(seq_len=3, storage=storage, replacement=False)
    assert rb.sample()["obs"].tolist() == [[0, 1, 2]]
    other.extend(episodes([2], first_obs=3))  # slots 0-1 again (its own cursor)
    with pytest.raises(ValueError, match=r"count 2 more step\(s\) written than the 0 the"):
        rb.sample()


def test_writes_through_the_buffer_pass_the_check_across_ring_wraps():
    rb = buffer(capacity=10)
    for k in range(8):  # 32 steps into 10 slots, one sample after each write
        rb.extend(episodes([4], first_obs=4 * k))
        obs = rb.sample()["obs"][0].tolist()  # one whole episode of the last two stored
        assert obs == list(range(obs[0], obs[0] + 4)) and obs[0] in (4 * k - 4, 4 * k)
    single = buffer(seq_len=2, capacity=10)
    for t in range(12):  # rb.add: one step at a time, episodes of 2
        single.add(episodes([2], first_obs=2 * (t // 2))[t % 2])
    with pytest.warns(UserWarning, match=r"2 step\(s\) were overwritten before any sample"):
        assert single.sample()["obs"][0, 0] % 2 == 0


def drawn_buffer():
    """A buffer mid-run: streams part-read, one write not read yet."""
    rb = buffer(num_streams=2, seq_len=3, capacity=20, episode_key="episode")
    rb.extend(episodes([3, 7, 2, 5]))
    [rb.sample() for _ in range(2)]
    rb.extend(episodes([4, 6], first_obs=17))  # 27 steps in 20 slots: the ring wrapped
    return rb


def test_a_pickled_buffer_emits_the_same_chunks_as_the_original():
    rb = drawn_buffer()
    copy = pickle.loads(pickle.dumps(rb))
    for _ in range(4):
        assert (copy.sample() == rb.sample()).all()
    assert copy.sampler._log.stamps is not rb.sampler._log.stamps
    assert copy.sampler.generator is not rb.sampler.generator


def test_shared_buffer_pickled_for_another_process_keeps_the_stamps_local():
    # rb.share(), then torch.multiprocessing's pickler (what a spawned process or a queue
    # uses): tensors it meets go to shared memory. The sampler's state travels as arrays,
    # so the owner's stamps stay local and the copy is independent.
    rb = drawn_buffer().share()
    stamps = rb.sampler._log.stamps.clone()
    copy = ForkingPickler.loads(bytes(ForkingPickler.dumps(rb.sampler)))
    assert not rb.sampler._log.stamps.is_shared()
    assert (copy._log.stamps == stamps).all() and copy._log.clock == rb.sampler._log.clock == 27
    copy.extend(torch.arange(5))  # the copy records writes of its own
    assert copy._log.clock == 32 and rb.sampler._log.clock == 27
    assert (rb.sampler._log.stamps == stamps).all()


def test_a_multi_process_collector_writing_into_the_buffer_is_named():
    # The unsupported layout, for real: MultiSyncCollector(replay_buffer=rb) spawns 2
    # CartPole workers that extend their copies of rb; the learner's sampler is told
    # nothing. The collector empties the buffer when it starts, so the first look reads
    # the first batch as a storage filled before the sampler saw it; the next batch is named.
    collectors = pytest.importorskip("torchrl.collectors")
    from torchrl.envs import GymEnv

    rb = buffer(num_streams=2, seq_len=4, capacity=64, traj_key=("collector", "traj_ids"))
    collector = collectors.MultiSyncCollector(
        [functools.partial(GymEnv, "CartPole-v1")] * 2, policy=None, frames_per_batch=32,
        total_frames=64, replay_buffer=rb,
    )
    try:
        batches = iter(collector)
        next(batches)
        rb.sampler.can_sample(rb.storage, 8)
        next(batches)
        with pytest.raises(ValueError, match=UNSEEN + r": the writers count \d+ more step"):
            rb.sample()
    finally:
        collector.shutdown()
