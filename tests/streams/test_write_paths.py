"""StreamChunkSampler under TorchRL's write paths: writes it did not see, pickling."""
import pytest
import torch
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
    assert single.sample()["obs"][0, 0] % 2 == 0
