import math
import re
import warnings
from contextlib import nullcontext

import numpy as np
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)

from torchrl_seqchunk import StreamChunkSampler


def episodes(lengths, first_obs=0, first_episode=0, done_last=True):
    """Steps of consecutive episodes: obs counts steps, "ep"/"k" are episode, step in it."""
    obs, ep, k, done = [], [], [], []
    for e, length in enumerate(lengths):
        obs += range(first_obs + len(obs), first_obs + len(obs) + length)
        ep += [first_episode + e] * length
        k += range(length)
        done += [False] * (length - 1) + [True]
    if not done_last:
        done[-1] = False
    n = len(obs)
    return TensorDict(
        {
            "obs": torch.tensor(obs),
            "ep": torch.tensor(ep),
            "k": torch.tensor(k),
            ("next", "done"): torch.tensor(done).reshape(n, 1),
        },
        [n],
    )


def buffer(num_streams, seq_len, capacity=1000, storage=LazyTensorStorage, **kwargs):
    kwargs.setdefault("generator", torch.Generator().manual_seed(0))
    sampler = StreamChunkSampler(num_streams, seq_len, **kwargs)
    rb = TensorDictReplayBuffer(
        storage=storage(capacity), sampler=sampler, batch_size=num_streams * seq_len
    )
    return rb


def test_chunk_layout_and_is_first_by_hand():
    # Find a seed whose first length-proportional draw is the 3-step episode (P = 3/8).
    for seed in range(100):
        rb = buffer(1, 4, generator=torch.Generator().manual_seed(seed))
        rb.extend(episodes([3, 5]))
        first = rb.sample()
        if first["obs"][0, 0] == 0:
            break
    else:
        pytest.fail("no seed drew the 3-step episode first")
    second = rb.sample()
    assert first.batch_size == torch.Size([1, 4])
    assert first["is_first"].shape == (1, 4, 1) and first["is_first"].dtype == torch.bool
    # stream: episode A (obs 0..2) then episode B (obs 3..7); chunk 2 continues B
    assert first["obs"].tolist() == [[0, 1, 2, 3]]
    assert second["obs"].tolist() == [[4, 5, 6, 7]]
    assert first["is_first"].squeeze(-1).tolist() == [[True, False, False, True]]
    assert second["is_first"].squeeze(-1).tolist() == [[False, False, False, False]]
    assert first["index"].tolist() == [[0, 1, 2, 3]]
    assert ("next", "done") in second.keys(True)


def test_draws_are_length_proportional():
    rb = buffer(16, 8, episode_key="episode")
    rb.extend(episodes([2, 6]))  # episode ids are write stamps of first steps: 0 and 2
    starts = []
    for _ in range(150):
        chunk = rb.sample()
        starts.append(chunk["episode"][chunk["is_first"].squeeze(-1)])
    starts = torch.cat(starts)
    n = starts.numel()
    share_short = (starts == 0).float().mean().item()
    # P(short) = 2 / (2 + 6); 4.5 standard errors of a proportion over n draws
    tolerance = 4.5 * math.sqrt(0.25 * 0.75 / n)
    assert n > 3000
    assert abs(share_short - 0.25) < tolerance


def check_streams(rows, firsts, stored_lengths):
    """Every stream is an in-order concatenation of whole stored episodes."""
    for row, first in zip(rows, firsts):
        ep, k = row[:, 0].tolist(), row[:, 1].tolist()
        assert first.tolist() == [step == 0 for step in k]
        assert k[0] == 0  # a stream starts with an episode start
        for t in range(1, len(k)):
            if k[t] == 0:  # the previous episode was emitted whole
                assert k[t - 1] == stored_lengths[ep[t - 1]] - 1
            else:  # the same episode continues, no step skipped or repeated
                assert (ep[t], k[t]) == (ep[t - 1], k[t - 1] + 1)
                assert row[t, 2] == row[t - 1, 2] + 1


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    num_streams=st.integers(1, 4),
    seq_len=st.integers(1, 7),
    num_chunks=st.integers(1, 8),
    seed=st.integers(0, 2**31),
)
def test_streams_concatenate_whole_episodes(lengths, num_streams, seq_len, num_chunks, seed):
    rb = buffer(num_streams, seq_len, generator=torch.Generator().manual_seed(seed))
    rb.extend(episodes(lengths))
    chunks = [rb.sample() for _ in range(num_chunks)]
    data = torch.cat(chunks, dim=1)  # [B, num_chunks * T]
    rows = torch.stack([data["ep"], data["k"], data["obs"]], -1)
    check_streams(rows, data["is_first"].squeeze(-1), lengths)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=10),
    num_streams=st.integers(1, 4),
    seq_len=st.integers(1, 6),
    seed=st.integers(0, 2**31),
)
def test_without_replacement_deals_each_episode_once_per_epoch(lengths, num_streams, seq_len, seed):
    rb = buffer(
        num_streams, seq_len, replacement=False, generator=torch.Generator().manual_seed(seed)
    )
    rb.extend(episodes(lengths))
    for _ in range(2):  # two epochs
        chunks = list(rb)  # iteration stops once the sampler ran out
        assert rb.sampler.ran_out
        data = torch.cat(chunks, dim=1)
        mask = data["collector", "mask"]
        assert (data["is_first"].squeeze(-1) | mask).all()  # padding resets the state
        real_per_stream = mask.sum(1)
        # greedy balancing: no stream exceeds the lightest by more than the longest episode
        assert real_per_stream.max() - real_per_stream.min() <= max(lengths)
        # the epoch ends with the chunk holding the longest stream's last step
        assert len(chunks) == math.ceil(real_per_stream.max().item() / seq_len)
        steps = sorted(data["obs"][mask].tolist())
        assert steps == list(range(sum(lengths)))  # every step exactly once
        for b in range(num_streams):
            real = mask[b]
            row = torch.stack([data["ep"][b], data["k"][b], data["obs"][b]], -1)[real]
            assert (mask[b, : real.sum()]).all()  # padding only at the end of a stream
            if real.any():
                check_streams(row[None], data["is_first"][b].squeeze(-1)[real][None], lengths)
                assert row[-1, 1] == lengths[row[-1, 0]] - 1  # the last episode is whole


def test_steps_added_one_by_one_and_emptied_buffer():
    rb = buffer(1, 3, replacement=False)
    for step in episodes([2, 4]).unbind(0):  # rb.add, one step at a time
        rb.add(step)
    chunks = list(rb)
    by_hand = ([[[0, 1, 2]], [[3, 4, 5]]], [[[2, 3, 4]], [[5, 0, 1]]])  # either episode first
    assert [c["obs"].tolist() for c in chunks] in by_hand
    rb.empty()  # on-policy: drop the rollout, write the next one
    rb.extend(episodes([3], first_obs=10))
    chunk = rb.sample()
    assert chunk["obs"].tolist() == [[10, 11, 12]]
    assert chunk["is_first"].squeeze(-1).tolist() == [[True, False, False]]
    assert rb.sampler.ran_out


def test_overwrites_emptying_every_stream_end_the_epoch():
    rb = buffer(1, 2, capacity=6, replacement=False)
    rb.extend(episodes([3, 3]))  # slots 0..5, one epoch is 3 chunks
    chunks = []
    for chunk in rb:
        chunks.append(chunk)
        if len(chunks) == 1:  # mid-epoch, a new rollout overwrites every slot
            rb.extend(episodes([3, 3], first_obs=10))
    assert len(chunks) == 1 and rb.sampler.ran_out  # the epoch ended at that write
    chunk = rb.sample()  # the next sample starts an epoch over the new rollout
    assert chunk["obs"].tolist() in ([[10, 11]], [[13, 14]])
    assert chunk["is_first"].squeeze(-1).tolist() == [[True, False]]
    assert not rb.sampler.ran_out


def test_incomplete_episode_is_not_drawn():
    rb = buffer(2, 5)
    rb.extend(episodes([3, 4], done_last=False))  # the 4-step episode is still running
    for _ in range(10):
        assert (rb.sample()["ep"] == 0).all()
    rb = buffer(2, 5, only_complete=False)
    rb.extend(episodes([3, 4], done_last=False))
    seen = torch.cat([rb.sample()["ep"] for _ in range(10)])
    assert set(seen.unique().tolist()) == {0, 1}


def test_overwritten_queued_steps_are_never_emitted():
    for seed in range(100):  # a seed whose first draw is episode 0 (slots 0..3)
        rb = buffer(1, 3, capacity=10, generator=torch.Generator().manual_seed(seed))
        rb.extend(episodes([4, 6]))  # slots 0..3 and 4..9, obs = slot
        if rb.sample()["obs"].tolist() == [[0, 1, 2]]:
            break
    else:
        pytest.fail("no seed drew episode 0 first")
    # step obs=3 (slot 3) is queued; a new 4-step episode (obs 10..13) overwrites slots 0..3
    rb.extend(episodes([4], first_obs=10, first_episode=2))
    chunk = rb.sample()
    assert chunk["is_first"][0, 0, 0]  # the stale rest was dropped: a fresh episode starts
    assert chunk["obs"][0, 0].item() in (4, 10)
    # episode 1 (slots 4..9) loses slots 4, 5: it is never drawn again; only the steps
    # already queued whose slots still hold them (obs 6..9) may finish, then new episodes
    rb.extend(episodes([2], first_obs=14, first_episode=3))
    seen = torch.cat([rb.sample()["obs"] for _ in range(30)], 1)[0].tolist()
    leftover = [obs for obs in seen if obs < 10]
    assert seen[: len(leftover)] == leftover == list(range(10 - len(leftover), 10))
    assert set(seen[len(leftover) :]) == {10, 11, 12, 13, 14, 15}


@settings(max_examples=30, deadline=None)
@given(
    writes=st.lists(
        st.tuples(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    capacity=st.integers(12, 30),
    num_streams=st.integers(1, 3),
    seq_len=st.integers(1, 5),
    seed=st.integers(0, 2**31),
)
def test_ring_overwrites_never_break_a_stream(writes, capacity, num_streams, seq_len, seed):
    rb = buffer(
        num_streams, seq_len, capacity=capacity, generator=torch.Generator().manual_seed(seed)
    )
    written, unread, chunks = 0, 0, []
    for lengths, then_sample in writes:  # write a few episodes, maybe sample two chunks
        data = episodes(lengths, first_obs=written, first_episode=written)
        written += len(data)
        unread += len(data)
        rb.extend(data)
        if not then_sample:
            continue
        lossy = unread > capacity  # some slot written twice since the sampler last read
        with pytest.warns(UserWarning, match="overwritten before any sample") if lossy else nullcontext():
            drawable = rb.can_sample()
        unread = 0
        if drawable:
            chunks += [rb.sample(), rb.sample()]
    if not chunks:
        return
    data = torch.cat(chunks, dim=1)
    ep, k, first = data["ep"], data["k"], data["is_first"].squeeze(-1)
    assert (first == (k == 0)).all()  # each row starts a fresh episode or continues one
    assert first[:, 0].all()
    same = (ep[:, 1:] == ep[:, :-1]) & (k[:, 1:] == k[:, :-1] + 1)
    assert (first[:, 1:] | same).all()  # no step of a stream is stale, skipped or repeated


def test_resume_from_state_dict_repeats_the_chunks():
    data = episodes([3, 7, 2, 9, 5, 4])
    rb = buffer(3, 4, generator=None, episode_key="episode")
    rb.extend(data)
    [rb.sample() for _ in range(3)]
    rb.extend(episodes([4, 6], first_obs=30, first_episode=6))  # not read by the sampler yet
    state = rb.state_dict()
    expected = [rb.sample() for _ in range(3)]
    torch.manual_seed(123)  # a different default generator seed for the new sampler
    resumed = buffer(3, 4, generator=None, episode_key="episode")
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.sample()
        assert (got == want).all()


def test_resume_from_disk_repeats_the_chunks(tmp_path):
    rb = buffer(2, 5, storage=LazyMemmapStorage, capacity=30)
    rb.extend(episodes([6, 8, 3, 9, 7]))  # 33 steps in 30 slots: the ring wrapped
    with pytest.warns(UserWarning, match=r"3 step\(s\) were overwritten before any sample"):
        [rb.sample() for _ in range(3)]
    rb.dumps(tmp_path)
    expected = [rb.sample() for _ in range(3)]
    resumed = buffer(2, 5, storage=LazyMemmapStorage, capacity=30, generator=None)
    resumed.loads(tmp_path)
    for want in expected:
        assert (resumed.sample() == want).all()


def test_storage_filled_before_the_sampler_is_read_in_slot_order():
    storage = LazyTensorStorage(100)
    TensorDictReplayBuffer(storage=storage).extend(episodes([3, 5]))
    sampler = StreamChunkSampler(
        1, 8, replacement=False, episode_key="episode", step_key="step"
    )
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=8)
    chunk = rb.sample()
    assert sorted(chunk["obs"][0].tolist()) == list(range(8))
    assert chunk["step"].tolist() == chunk["k"].tolist()
    assert sorted(set(chunk["episode"][0].tolist())) == [-8, -5]  # stamped before any write


def test_padded_chunk_steps_and_episode_ids_by_hand():
    # 2 streams of an epoch of episodes [5, 2, 1]: LPT deals 5 to one stream and 2 + 1
    # to the other; the 3-step stream is padded with step -1, episode -1 and mask False.
    rb = buffer(2, 5, replacement=False, episode_key="episode", step_key="step")
    rb.extend(episodes([5, 2, 1]))
    chunk = rb.sample()
    rows = sorted(range(2), key=lambda b: -int(chunk["collector", "mask"][b].sum()))
    long, short = chunk[rows[0]], chunk[rows[1]]
    assert long["step"].tolist() == [0, 1, 2, 3, 4] and long["collector", "mask"].all()
    assert set(long["episode"].tolist()) == {long["episode"][0].item()}
    assert short["step"].tolist() in ([0, 1, 0, -1, -1], [0, 0, 1, -1, -1])
    assert short["collector", "mask"].tolist() == [True, True, True, False, False]
    ids = short["episode"].tolist()
    assert ids[3:] == [-1, -1] and len(set(ids[:3])) == 2 and long["episode"][0].item() not in ids
    assert short["is_first"].squeeze(-1).tolist()[:3] == [s == 0 for s in short["step"].tolist()[:3]]


def test_wrapped_storage_filled_before_the_sampler_is_read_in_time_order():
    # 14 steps in 10 slots: slots 0-3 hold steps 10-13, slots 4-9 steps 4-9. In time order
    # (from slot 4) the storage holds episode 1 (steps 4-6), 2 (7-11) and 3 (12-13); in slot
    # order steps 10-11 would pass for a whole episode and 7-9 would never end. Step 3, whose
    # end flag said that step 4 starts an episode, was overwritten: episode 1 is dropped.
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(episodes([4, 3, 5, 2]))
    sampler = StreamChunkSampler(1, 10, replacement=False, step_key="step")
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=10)
    with pytest.warns(UserWarning, match="ring wrapped before the sampler first saw it"):
        chunk = rb.sample()
    mask = chunk["collector", "mask"]
    assert sorted(chunk["obs"][mask].tolist()) == list(range(7, 14))
    assert chunk["step"][mask].tolist() == chunk["k"][mask].tolist()
    assert (chunk["is_first"].squeeze(-1)[mask] == (chunk["k"][mask] == 0)).all()


@pytest.mark.parametrize("replacement", [False, True])
def test_wrapped_storage_filled_before_the_sampler_drops_its_oldest_partial_episode(replacement):
    # Episodes of 3, 5, 4 and 3 steps (0-2, 3-7, 8-11, 12-14) in 10 slots: steps 5-14
    # survive, slot s % 10 holding step s. Steps 5-7 are the tail of an episode whose start
    # was overwritten: never drawn. Episodes 8-11 and 12-14 are, whole and from their start.
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(episodes([3, 5, 4, 3]))
    sampler = StreamChunkSampler(
        2, 7, replacement=replacement, step_key="step", generator=torch.Generator().manual_seed(0)
    )
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=14)
    for i in range(3):
        with pytest.warns(UserWarning, match="ring wrapped before") if i == 0 else nullcontext():
            chunk = rb.sample()
        valid = chunk.get(("collector", "mask"), torch.ones(2, 7, dtype=torch.bool))
        obs, k = chunk["obs"][valid], chunk["k"][valid]
        assert set(obs.tolist()) <= set(range(8, 15))
        assert chunk["step"][valid].tolist() == k.tolist()  # the sampler's step-in-episode
        assert chunk["is_first"].squeeze(-1)[valid].tolist() == (k == 0).tolist()
    if not replacement:  # one epoch: each of the two episodes once
        assert sorted(obs.tolist()) == list(range(8, 15))


@pytest.mark.parametrize(
    "lengths, drawn",
    [([3, 7], range(10)),  # 10 steps: never wrapped, the first episode starts at slot 0
     ([4, 6, 3, 7], range(13, 20))],  # 20 steps: wrapped twice, the cursor at the last slot
)
def test_full_storage_with_its_cursor_at_the_last_slot_wrapped_if_more_was_written(lengths, drawn):
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(episodes(lengths))
    sampler = StreamChunkSampler(1, 10, replacement=False)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=10)
    wrapped = sum(lengths) > 10
    with pytest.warns(UserWarning, match="ring wrapped before") if wrapped else nullcontext():
        chunk = rb.sample()
    assert sorted(chunk["obs"][chunk["collector", "mask"]].tolist()) == list(drawn)


def two_envs(steps):
    """A flattened [2 envs, steps] collector batch, episodes of 3 steps: obs 100 * env + t,
    a trajectory id per episode, as TorchRL's collector numbers them."""
    t = torch.arange(steps).repeat_interleave(2)
    env = torch.arange(2).repeat(steps)
    return TensorDict(
        {
            "obs": 100 * env + t,
            ("collector", "traj_ids"): 100 * env + t // 3,
            ("next", "done"): (t % 3 == 2).reshape(-1, 1),
        },
        [2 * steps],
    )


def test_storage_filled_to_capacity_with_trajectory_ids_draws_every_episode_silently():
    # 2 envs x 5 steps in 10 slots, never wrapped: episodes 0-2 and 100-102 are whole
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(two_envs(5))
    sampler = StreamChunkSampler(1, 3, replacement=False, traj_key=("collector", "traj_ids"))
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = sorted(rb.sample()["obs"][0].tolist() + rb.sample()["obs"][0].tolist())
    assert drawn == [0, 1, 2, 100, 101, 102]


def test_wrapped_storage_with_trajectory_ids_says_why_it_drops_every_episode():
    # 2 envs x 8 steps in 10 slots: steps t = 3..7 survive. The trajectories of the steps
    # overwritten (t = 0..2) are unknown, so no stored episode is known to be whole: all are
    # dropped, and the warning says why before the sample finds nothing to draw.
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(two_envs(8))
    sampler = StreamChunkSampler(1, 3, traj_key=("collector", "traj_ids"))
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=3)
    with pytest.warns(UserWarning, match=r"ring wrapped before the sampler first saw it.*"
                      r"every episode written after them.*Build the buffer with this sampler"):
        assert not sampler.can_sample(storage, 3)
    with pytest.raises(ValueError, match="no complete episode"):
        rb.sample()


def test_wrapped_storage_with_end_flags_warns_that_it_drops_the_oldest_episode():
    # steps 5-14 of episodes 0-2, 3-7, 8-11, 12-14 survive: 5-7 are not drawn
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(episodes([3, 5, 4, 3]))
    rb = TensorDictReplayBuffer(storage=storage, sampler=StreamChunkSampler(1, 7), batch_size=7)
    with pytest.warns(UserWarning, match=r"ring wrapped before.*the episode holding it is dropped"):
        assert sorted(rb.sample()["obs"][0].tolist()) == list(range(8, 15))


def test_wrapped_storage_written_again_before_the_first_sample_is_refused():
    storage = LazyTensorStorage(10)
    TensorDictReplayBuffer(storage=storage).extend(episodes([4, 3, 5, 2]))
    rb = TensorDictReplayBuffer(
        storage=storage, sampler=StreamChunkSampler(1, 4), batch_size=4
    )
    rb.extend(episodes([2], first_obs=100))
    with pytest.raises(ValueError, match=r"time order of the 8 step\(s\).*Sample once before"):
        rb.sample()


def test_end_flags_warn_when_more_than_the_capacity_is_written_between_samples():
    # 24 steps into 10 slots in one go: steps 14-23 survive. Step 14 starts episode 3
    # (steps 14-18), but the end flag of step 13 is gone, so that episode is dropped,
    # loudly; episode 4 (steps 19-23) is drawn.
    rb = buffer(1, 5, capacity=10, replacement=False)
    rb.extend(episodes([4, 5, 5, 5, 5]))
    with pytest.warns(UserWarning, match=r"14 step\(s\) were overwritten.*starts an episode"):
        chunk = rb.sample()
    assert chunk["obs"][0].tolist() == [19, 20, 21, 22, 23]
    assert rb.sampler.ran_out  # the epoch held that one episode only


def test_rows_a_writer_skips_are_not_recorded_as_writes():
    from torchrl.data import TensorDictMaxValueWriter

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4),
        sampler=StreamChunkSampler(1, 2, replacement=False),
        writer=TensorDictMaxValueWriter(rank_key="score"),
        batch_size=2,
    )
    data = episodes([2, 2])
    data["score"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rb.extend(data)  # slots 0-3 hold the two episodes
    low = episodes([1], first_obs=50)
    low["score"] = torch.tensor([0.0])  # below every stored score: not written, index -1
    with pytest.warns(UserWarning, match=r"stored only 0 of 1 written rows"):
        rb.extend(low)
    chunks = [rb.sample()["obs"][0].tolist() for _ in range(2)]
    assert sorted(chunks) == [[0, 1], [2, 3]]  # slot 3's episode is still drawn
    assert rb.sampler.add(None) is None  # rb.add of a skipped row hands the sampler None


def test_trajectory_ids_delimit_episodes():
    data = episodes([3, 5, 2])
    del data["next", "done"]
    rb = buffer(2, 4, traj_key="ep")
    rb.extend(data)
    chunk = torch.cat([rb.sample() for _ in range(10)], 1)
    # the last trajectory may still be running: only ids 0 and 1 are complete
    assert set(chunk["ep"].unique().tolist()) == {0, 1}
    assert (chunk["is_first"].squeeze(-1) == (chunk["k"] == 0)).all()


def test_is_first_key_and_step_key_options():
    rb = buffer(1, 3, is_first_key="is_init", step_key=("diag", "step"))
    rb.extend(episodes([5]))
    chunk = rb.sample()
    assert chunk["is_init"].squeeze(-1).tolist() == [[True, False, False]]
    assert chunk["diag", "step"].tolist() == [[0, 1, 2]]


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        ((0, 4), {}, ValueError, "num_streams must be >= 1, got 0"),
        ((2, -1), {}, ValueError, "seq_len must be >= 1, got -1"),
        ((2, 4.0), {}, TypeError, "seq_len must be an int"),
        ((True, 4), {}, TypeError, "num_streams must be an int"),
        ((np.int64(0), 4), {}, ValueError, "num_streams must be >= 1, got 0"),
        ((2, np.int32(0)), {}, ValueError, "seq_len must be >= 1, got 0"),
        ((2, 4), {"generator": 3}, TypeError, "generator must be a torch.Generator"),
        ((2, 4), {"seed": 1.5}, TypeError, r"seed must be an int in \[0, 18446744073709551615\], got 1.5"),
        ((2, 4), {"seed": -1}, ValueError, r"seed must be in \[0, 18446744073709551615\], got -1"),
        ((2, 4), {"seed": 2**64}, ValueError, "seed must be in"),
        ((2, 4), {"seed": 0, "generator": torch.Generator()}, ValueError,
         "pass either seed= or generator=, not both; got seed=0"),
    ],
)
def test_bad_arguments(args, kwargs, error, words):
    with pytest.raises(error, match=words):
        StreamChunkSampler(*args, **kwargs)


def test_equal_seeds_give_equal_chunks_as_a_seeded_generator_does():
    def chunks(**kwargs):
        kwargs.setdefault("generator", None)
        rb = buffer(3, 4, episode_key="episode", **kwargs)
        rb.extend(episodes([3, 7, 2, 9, 5, 4]))
        return [rb.sample() for _ in range(4)]

    first, again = chunks(seed=5), chunks(seed=np.uint64(5))
    by_generator = chunks(generator=torch.Generator().manual_seed(5))
    for a, b, c in zip(first, again, by_generator):
        assert (a == b).all() and (a == c).all()
    # 6 episodes, 3 streams: some episode drawn differently within 4 chunks of another seed
    other = chunks(seed=6)
    assert any((a["episode"] != b["episode"]).any() for a, b in zip(first, other))
    assert StreamChunkSampler(1, 1, seed=2**64 - 1).generator.initial_seed() == 2**64 - 1


def test_numpy_integer_sizes_are_accepted():
    rb = buffer(np.int64(1), np.int32(3))
    rb.extend(episodes([5]))
    assert rb.sample()["obs"].tolist() == [[0, 1, 2]]
    assert type(rb.sampler.num_streams) is int and type(rb.sampler.seq_len) is int


def test_no_complete_episode_error_names_the_count():
    rb = buffer(2, 4)
    rb.extend(episodes([6], done_last=False))
    with pytest.raises(ValueError, match=r"holds 6 step\(s\).*only_complete=False"):
        rb.sample()


@pytest.mark.parametrize(
    "traj_key, keep_done, says, not_says",
    [
        (None, True, r"\('next', 'done'\) is never True at the end", "traj"),
        ("traj", True, r"\('next', 'done'\) is never True at the end", "changes"),
        ("traj", False, r"'traj' never changes after a whole episode .no \('next', 'do", "True"),
    ],
)
def test_no_complete_episode_error_names_the_rule_in_use(traj_key, keep_done, says, not_says):
    rb = buffer(1, 2, traj_key=traj_key)
    data = episodes([4], done_last=False).set("traj", torch.tensor([0, 0, 1, 1]))
    if traj_key is None or not keep_done:  # one id: no change, hence no end
        data["traj"] = torch.zeros(4, dtype=torch.long)
    rb.extend(data if keep_done else data.exclude(("next", "done")))
    with pytest.raises(ValueError, match="no complete episode") as error:
        rb.sample()
    assert re.search(says, str(error.value))
    assert not_says not in str(error.value)


def test_episode_longer_than_storage_error():
    rb = buffer(2, 4, capacity=5)
    rb.extend(episodes([8]))  # the ring keeps the last 5 steps, never a whole episode
    with pytest.warns(UserWarning, match=r"3 step\(s\) were overwritten"), \
            pytest.raises(ValueError, match="longer than the storage capacity"):
        rb.sample()


def test_missing_end_key_and_non_bool_flags():
    rb = buffer(1, 2)
    data = episodes([3])
    rb.extend(data.exclude(("next", "done")).set(("next", "terminated"), data["next", "done"]))
    with pytest.raises(ValueError, match=r"key \('next', 'done'\) not found"):
        rb.sample()
    rb = buffer(1, 2)
    rb.extend(data.set(("next", "done"), data["next", "done"].long()))
    with pytest.raises(TypeError, match="must hold bool flags, got dtype torch.int64"):
        rb.sample()
    with pytest.raises(TypeError, match="must hold bool flags"):  # the writes were kept
        rb.sample()


def test_multi_dimensional_done_flags_are_refused():
    rb = buffer(1, 2)
    data = episodes([3])
    data["next", "done"] = data["next", "done"].expand(3, 5).unsqueeze(-1)  # [N, 5, 1]
    rb.extend(data)
    with pytest.raises(ValueError, match=r"one flag per step, shaped \[N\] or \[N, 1\], got \[5, 1\]"):
        rb.sample()


def test_storages_that_do_not_read_as_one_tensordict_are_refused_with_the_fix():
    rb = TensorDictReplayBuffer(storage=ListStorage(10), sampler=StreamChunkSampler(1, 2), batch_size=2)
    rb.extend(episodes([3]))
    with pytest.raises(TypeError, match=r"ListStorage\[:\] gives a list: a ListStorage keeps every "
                       r"written item apart; build the buffer with LazyTensorStorage\(capacity\) "
                       r"or LazyMemmapStorage\(capacity\)"):
        rb.sample()
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=StreamChunkSampler(1, 2), batch_size=2)
    rb.extend(torch.arange(3))
    with pytest.warns(UserWarning), pytest.raises(
        TypeError, match=r"LazyTensorStorage\[:\] gives a Tensor: extend the buffer with TensorDicts"
    ):
        rb.sample()


def test_two_dimensional_storage_is_refused_at_the_first_write():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100, ndim=2), sampler=StreamChunkSampler(1, 4), batch_size=4
    )
    batch = torch.stack([episodes([5]), episodes([5])])  # [num_envs, T], a collector's layout
    with pytest.raises(ValueError, match=r"multi-dimensional write index.*ndim=2.*reshape\(-1\)"):
        rb.extend(batch)
    assert rb.sampler._log.clock == 0  # nothing recorded


def test_buffer_prefetch_above_one_is_refused():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100), sampler=StreamChunkSampler(1, 4), batch_size=4,
        prefetch=2,
    )
    rb.extend(episodes([5, 5]))
    with pytest.raises(ValueError, match=r"prefetch=2.*out of order.*ChunkPrefetcher"):
        rb.sample()


def test_plain_replay_buffer_gets_a_warning_naming_tensordict_replay_buffer():
    sampler = StreamChunkSampler(1, 4, generator=torch.Generator().manual_seed(0))
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
    rb.extend(episodes([4]))
    with pytest.warns(UserWarning, match="Use TensorDictReplayBuffer"):
        chunk, info = rb.sample(return_info=True)
    assert "is_first" not in chunk.keys()  # the buffer dropped it
    assert info["is_first"].squeeze(-1).tolist() == [[True, False, False, False]]
    rb = buffer(1, 4)
    rb.extend(episodes([4]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning in a TensorDictReplayBuffer
        assert rb.sample()["is_first"].squeeze(-1).tolist() == [[True, False, False, False]]


def test_wrong_batch_size_and_state_mismatch():
    rb = buffer(2, 3)
    rb.extend(episodes([4]))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="batch_size must be"):
        rb.sample(5)
    with pytest.raises(ValueError, match="num_streams, seq_len"):
        StreamChunkSampler(3, 3).load_state_dict(rb.sampler.state_dict())
    # a state read with other settings (an epoch state into a sampler with replacement, other
    # keys) is refused, the sampler unchanged; one saved before settings were kept loads
    state = rb.sampler.state_dict()
    for other in ({"replacement": False}, {"only_complete": False}, {"end_key": "done"},
                  {"traj_key": ("collector", "traj_ids")}, {"init_key": None}):
        with pytest.raises(ValueError, match=f"other settings .*{next(iter(other))}"):
            StreamChunkSampler(2, 3, **other).load_state_dict(state)
    # the stream state alone too (load_stream_state, a prefetcher's): its queues never end
    with pytest.raises(ValueError, match="taken with replacement=True, this sampler has replacement=False"):
        StreamChunkSampler(2, 3, replacement=False).load_stream_state(state["streams"])
    del state["settings"], state["streams"]["replacement"]  # saved before either was kept: read from the state
    with pytest.raises(ValueError, match="taken with replacement=True"):
        StreamChunkSampler(2, 3, replacement=False).load_state_dict(state)
    StreamChunkSampler(2, 3, only_complete=False).load_state_dict(state)


def interleaved_collector_batches():
    """Two envs, two collector batches [2 envs, 3 steps], each flattened env after env.

    (traj, k) per step; traj 0 runs over both batches, traj 2 too (on env 1):
      batch 1: env 0 (0,0) (0,1) (0,2)        env 1 (1,0) (1,1)end (2,0)
      batch 2: env 0 (0,3)end (3,0) (3,1)     env 1 (2,1) (2,2)end (4,0)
    Complete episodes: traj 0 (4 steps), 1 (2 steps), 2 (3 steps); 3 and 4 still run.
    """
    def batch(traj, k, done):
        n = len(traj)
        return TensorDict(
            {
                "traj": torch.tensor(traj), "k": torch.tensor(k),
                ("collector", "traj_ids"): torch.tensor(traj),
                ("next", "done"): torch.tensor(done).reshape(n, 1),
            },
            [n],
        )

    first = batch([0, 0, 0, 1, 1, 2], [0, 1, 2, 0, 1, 0], [0, 0, 0, 0, 1, 0])
    second = batch([0, 3, 3, 2, 2, 4], [3, 0, 1, 1, 2, 0], [1, 0, 0, 0, 1, 0])
    for data in (first, second):
        data["next", "done"] = data["next", "done"].bool()
    return first, second


@pytest.mark.parametrize("only_complete", [True, False])
def test_trajectories_interleaved_by_a_collector_are_stitched(only_complete):
    rb = buffer(1, 12, replacement=False, only_complete=only_complete,
                traj_key=("collector", "traj_ids"))
    for data in interleaved_collector_batches():
        rb.extend(data)
    chunk = rb.sample()
    real = chunk["collector", "mask"][0]
    traj, k = chunk["traj"][0][real].tolist(), chunk["k"][0][real].tolist()
    lengths = {0: 4, 1: 2, 2: 3} if only_complete else {0: 4, 1: 2, 2: 3, 3: 2, 4: 1}
    assert real.sum() == sum(lengths.values())
    t = 0
    while t < len(traj):  # the stream is whole trajectories, each in step order
        episode = traj[t]
        assert traj[t : t + lengths[episode]] == [episode] * lengths[episode]
        assert k[t : t + lengths[episode]] == list(range(lengths[episode]))
        t += lengths.pop(episode)
    assert not lengths
    assert chunk["is_first"][0, :, 0][real].tolist() == [step == 0 for step in k]


def test_resume_between_collector_batches_keeps_running_trajectories():
    def make():
        return buffer(2, 3, traj_key=("collector", "traj_ids"),
                      generator=torch.Generator().manual_seed(3))

    first, second = interleaved_collector_batches()
    rb = make()
    rb.extend(first)
    rb.sample()
    state = rb.sampler.state_dict()
    rb.extend(second)
    expected = [rb.sample() for _ in range(4)]
    resumed = make()
    resumed.extend(first)
    resumed.sampler.load_state_dict(state)
    resumed.extend(second)
    for want in expected:
        have = resumed.sample()
        assert have["k"].tolist() == want["k"].tolist()
        assert have["traj"].tolist() == want["traj"].tolist()
    assert set(torch.cat([c["traj"] for c in expected]).unique().tolist()) <= {0, 1, 2}


def test_bookkeeping_stays_within_the_storage_capacity():
    """Trajectories that never end (a collector reset at every batch) or that outlive the
    storage are forgotten once none of their steps is stored; a resume keeps that count."""
    def batch(k):  # 6 steps: traj 0 runs on and on, 2k+1 ends, 2k+2 is abandoned
        done = torch.tensor([False, False, False, True, False, False]).unsqueeze(-1)
        traj = torch.tensor([0, 0, 2 * k + 1, 2 * k + 1, 2 * k + 2, 2 * k + 2])
        return TensorDict({"traj": traj, ("next", "done"): done}, [6])

    def make():
        return buffer(1, 2, capacity=12, traj_key="traj", only_complete=False,
                      generator=torch.Generator().manual_seed(1))

    rb, resumed = make(), make()
    for k in range(50):
        rb.extend(batch(k))
        resumed.extend(batch(k))
        chunk = rb.sample()
        if k == 30:
            resumed.sampler.load_state_dict(rb.sampler.state_dict())
        elif k > 30:
            assert resumed.sample()["traj"].tolist() == chunk["traj"].tolist()
    # slots 0..5 hold batch 48 (traj 0, 97, 98), slots 6..11 batch 49 (traj 0, 99, 100)
    for sampler in (rb.sampler, resumed.sampler):
        tracker = sampler._tracker
        assert sorted(tracker.open) == [(0,), (98,), (100,)]
        assert not tracker.open[(0,)].whole  # its first steps were overwritten
        drawable = sorted(slots.tolist() for _, slots in tracker.all())
        # 0 (its steps that remain, as a continuing stream), 97, 98, 99, 100
        assert drawable == [[0, 1, 6, 7], [2, 3], [4, 5], [8, 9], [10, 11]]
        listed = sum(p.numel() for e in tracker.open.values() for p in e.parts)
        assert listed + sum(s.numel() for s in tracker.episodes.slots) <= 12


def test_a_continuing_task_keeps_streaming_after_the_ring_wraps():
    rb = buffer(1, 4, capacity=10, only_complete=False)

    def never_done(obs):
        return TensorDict({"obs": torch.tensor(obs), ("next", "done"): torch.zeros(len(obs), 1, dtype=torch.bool)}, [len(obs)])

    rb.extend(never_done(range(8)))
    chunks = [rb.sample()]
    rb.extend(never_done(range(8, 12)))  # slots 8, 9, 0, 1: its steps 0 and 1 are overwritten
    chunks += [rb.sample() for _ in range(4)]
    # the stream plays obs 0..7 as queued, then draws the episode again: its steps 2..11
    assert [c["obs"][0].tolist() for c in chunks] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 2, 3]]
    assert [c["is_first"][0].squeeze(-1).tolist() for c in chunks] == [
        [True, False, False, False], [False] * 4, [True, False, False, False], [False] * 4,
        [False, False, True, False]]


def test_unflattened_collector_batch_is_refused():
    rb = buffer(2, 3)
    rb.extend(torch.stack([episodes([3]), episodes([3])]))  # [num_envs, T] in one slot each
    with pytest.raises(ValueError, match=r"batch shape \[3\].*reshape\(-1\)"):
        rb.sample()


def test_running_trajectories_are_drawn_whole_so_far_with_replacement():
    rb = buffer(4, 5, only_complete=False, traj_key=("collector", "traj_ids"))
    for data in interleaved_collector_batches():
        rb.extend(data)
    lengths = {0: 4, 1: 2, 2: 3, 3: 2, 4: 1}  # 3 and 4 as written so far
    data = torch.cat([rb.sample() for _ in range(30)], 1)
    rows = torch.stack([data["traj"], data["k"], torch.zeros_like(data["k"])], -1)
    rows[..., 2] = torch.arange(rows.shape[1])  # steps of an episode follow each other
    check_streams(rows, data["is_first"].squeeze(-1), lengths)
    assert set(data["traj"].unique().tolist()) == set(lengths)



def test_interleaved_envs_without_traj_key_are_refused():
    rb = buffer(2, 3)
    rb.extend(interleaved_collector_batches()[0])  # traj 0 -> 1 with no done between
    with pytest.raises(ValueError, match=r"changes from \[0\] to \[1\].*traj_key="):
        rb.sample()
    data = episodes([3, 5])  # one env: the id changes only after a done
    data["collector", "traj_ids"] = data["ep"]
    rb = buffer(2, 3)
    rb.extend(data)
    assert rb.sample().batch_size == (2, 3)



def test_single_env_cut_by_reset_at_each_iter_is_told_the_right_cause():
    # one env, a collector with reset_at_each_iter=True: batch 1 = traj 0 cut after 3 steps
    # with no done, batch 2 = traj 1 (a fresh reset) ending at step 2
    done = torch.tensor([0, 0, 0, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
    data = TensorDict({("next", "done"): done, ("collector", "traj_ids"): torch.tensor([0, 0, 0, 1, 1, 1])}, [6])
    rb = buffer(1, 3)
    rb.extend(data)
    with pytest.raises(ValueError, match=r"changes from \[0\] to \[1\].*reset_at_each_iter=True.*traj_key="):
        rb.sample()
    rb = buffer(1, 3, traj_key=("collector", "traj_ids"))
    rb.extend(data)  # with traj_key the cut trajectory stays open and never mixes in
    chunk = rb.sample()
    assert chunk["collector", "traj_ids"].tolist() == [[1, 1, 1]]
    assert chunk["is_first"].squeeze(-1).tolist() == [[True, False, False]]


def restarted(obs, traj, done, init=True):
    """Steps of one env: obs as given, its trajectory id, done flags, is_init at its first step
    (``init=False``: no is_init stored)."""
    n = len(obs)
    data = TensorDict({"obs": torch.tensor(obs), ("collector", "traj_ids"): torch.full((n,), traj),
                       ("next", "done"): torch.tensor(done).reshape(n, 1)}, [n])
    if init:
        data["is_init"] = (torch.arange(n) == 0).reshape(n, 1)
    return data


def pieces(chunk):
    """Row 0's obs cut where is_first is set: the episodes (the first and last maybe cut by
    the chunk's start and end)."""
    out = []
    for t, (obs, first) in enumerate(zip(chunk["obs"][0].tolist(), chunk["is_first"][0, :, 0].tolist())):
        if first or not t:
            out.append([])
        out[-1].append(obs)
    return out


@pytest.mark.parametrize("through_state", [False, True])
def test_a_collector_restarted_under_the_same_ids_never_joins_the_open_trajectory(through_state):
    # run 1 leaves trajectory 0 open (no done); the restarted collector numbers from 0 again
    before = restarted([100, 101, 102], 0, [False, False, False])
    after = restarted([0, 1], 0, [False, True])
    rb = buffer(1, 5, traj_key=("collector", "traj_ids"))
    rb.extend(before)
    if through_state:  # as after a checkpoint: a new buffer, the sampler's state loaded
        state = rb.sampler.state_dict()
        rb = buffer(1, 5, traj_key=("collector", "traj_ids"))
        rb.extend(before)
        rb.sampler.load_state_dict(state)
    rb.extend(after)
    assert pieces(rb.sample()) == [[0, 1], [0, 1], [0]]  # the cut trajectory is never drawn
    # with only_complete=False it is drawn as it is, an episode of its own
    rb = buffer(1, 10, traj_key=("collector", "traj_ids"), only_complete=False)
    rb.extend(before)
    rb.extend(after)
    drawn = [p for _ in range(4) for p in pieces(rb.sample())]  # a stream goes on across chunks
    assert all(p in ([100, 101, 102], [0, 1]) or p in ([100], [100, 101], [101, 102], [102], [0], [1])
               for p in drawn), drawn
    assert [100, 101, 102] in drawn and [0, 1] in drawn


@pytest.mark.parametrize("how", ["state_taken", "state_loaded", "pickled"])
def test_a_restart_in_writes_not_yet_read_survives_a_saved_state(how):
    # both writes are still pending when the state is taken (a checkpoint, a pickle): each
    # write's bounds are kept, so the restart's is_init still cuts the open trajectory
    rb = buffer(1, 5, traj_key=("collector", "traj_ids"))
    rb.extend(restarted([100, 101, 102], 0, [False, False, False]))
    rb.extend(restarted([0, 1], 0, [False, True]))
    state = rb.sampler.state_dict()
    if how == "state_loaded":
        fresh = buffer(1, 5, traj_key=("collector", "traj_ids"))
        fresh.extend(restarted([100, 101, 102], 0, [False, False, False]))
        fresh.extend(restarted([0, 1], 0, [False, True]))
        fresh.sampler.load_state_dict(state)
        rb = fresh
    elif how == "pickled":
        rb = pickle.loads(pickle.dumps(rb))
    assert pieces(rb.sample()) == [[0, 1], [0, 1], [0]]


def test_a_restart_without_trajectory_ids_is_cut_and_with_ids_alone_ends_the_episode():
    before = restarted([100, 101, 102], 0, [False, False, False])
    after = restarted([0, 1], 0, [False, True])
    rb = buffer(1, 4)  # end flags alone: one open episode, cut by the new start
    rb.extend(before)
    rb.extend(after)
    assert pieces(rb.sample()) == [[0, 1], [0, 1]]
    rb = buffer(1, 4)  # the same where the restarted collector's ids differ: cut, not refused
    rb.extend(restarted([100, 101, 102], 3, [False, False, False]))
    rb.extend(after)
    assert pieces(rb.sample()) == [[0, 1], [0, 1]]
    # ids alone (no done stored): the start ends (100, 101, 102) as an id change ends (0, 1)
    rb = buffer(1, 12, traj_key=("collector", "traj_ids"))
    for data in (before, after, restarted([7], 1, [False])):
        rb.extend(data.exclude(("next", "done")))
    drawn = pieces(rb.sample())
    assert all(p in ([100, 101, 102], [0, 1]) for p in drawn[:-1]), drawn
    assert [100, 101, 102] in drawn and [0, 1] in drawn


def test_without_is_init_or_with_init_key_none_a_restart_cannot_be_told():
    before = restarted([100, 101, 102], 0, [False, False, False], init=False)
    after = restarted([0, 1], 0, [False, True], init=False)
    rb = buffer(1, 5, traj_key=("collector", "traj_ids"))
    rb.extend(before)
    rb.extend(after)
    assert rb.sample()["obs"].tolist() == [[100, 101, 102, 0, 1]]  # the documented limit
    rb = buffer(1, 5, traj_key=("collector", "traj_ids"), init_key=None)
    rb.extend(restarted([100, 101, 102], 0, [False] * 3))
    rb.extend(restarted([0, 1], 0, [False, True]))
    assert rb.sample()["obs"].tolist() == [[100, 101, 102, 0, 1]]


def test_a_write_without_is_init_over_slots_that_held_one_keeps_its_episodes_whole():
    # the storage keeps a key a write lacks: slots 0 and 3 still say is_init when obs 20..23 land there
    rb = buffer(1, 4, capacity=6, traj_key=("collector", "traj_ids"))
    rb.extend(restarted([0, 1, 2], 0, [False, False, True]))
    rb.extend(restarted([10, 11, 12], 1, [False, False, True]))
    rb.sample()
    rb.extend(restarted([20, 21, 22, 23], 2, [False, False, False, True], init=False))
    assert rb.storage[:]["is_init"].squeeze(-1).tolist() == [True, False, False, True, False, False]
    chunks = [rb.sample() for _ in range(6)]
    obs = torch.cat([c["obs"].reshape(-1) for c in chunks])
    first = torch.cat([c["is_first"].reshape(-1) for c in chunks])
    assert first[obs == 20].all() and not first[(obs > 20) & (obs <= 23)].any()  # 20..23 one episode
    assert (obs == 23).any()


def test_a_sampler_pickled_before_init_key_loads_with_its_default():
    rb = buffer(1, 3, traj_key=("collector", "traj_ids"))
    rb.extend(restarted([0, 1, 2], 0, [False, False, True]))
    state = rb.sampler.__getstate__()
    del state["init_key"]  # as pickled by the version before the option
    copy = StreamChunkSampler.__new__(StreamChunkSampler)
    copy.__setstate__(state)
    assert copy.init_key == "is_init"


def test_non_bool_init_flags_are_refused_by_name():
    data = restarted([0, 1], 0, [False, True])
    data["is_init"] = data["is_init"].long()
    rb = buffer(1, 2, traj_key=("collector", "traj_ids"))
    rb.extend(data)
    with pytest.raises(TypeError, match="init_key 'is_init' must hold bool flags, got dtype torch.int64"):
        rb.sample()


def test_resume_keeps_which_episode_owns_each_slot():
    """A running trajectory that lost its first slots to a finished episode must not claim
    them back on load: overwriting them later must still remove that episode."""
    def steps(traj, k, done):
        return TensorDict(
            {
                "traj": torch.tensor(traj), "k": torch.tensor(k),
                ("collector", "traj_ids"): torch.tensor(traj),
                ("next", "done"): torch.tensor(done, dtype=torch.bool).unsqueeze(-1),
            },
            [len(traj)],
        )

    rb = buffer(1, 5, capacity=6, replacement=False, traj_key=("collector", "traj_ids"))
    rb.extend(steps([0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]))  # slots 0-3
    assert not rb.sampler.can_sample(rb.storage, 5)  # read; no episode has ended
    # traj 1 ends in slot 0 and traj 2 (one step) in slot 1, over the start of traj 0
    rb.extend(steps([0, 0, 1, 2], [2, 3, 2, 0], [0, 0, 1, 1]))
    rb.sample()
    rb.sampler.load_state_dict(rb.sampler.state_dict())
    # traj 0 ends; traj 3 fills slots 4, 5, 0, 1, over trajs 1 and 2
    rb.extend(steps([0, 0, 3, 3, 3, 3], [4, 5, 0, 1, 2, 3], [0, 1, 0, 0, 0, 1]))
    chunk = rb.sample()  # a new epoch: the only whole episode left is traj 3
    real = chunk["collector", "mask"][0]
    assert chunk["traj"][0][real].tolist() == [3, 3, 3, 3]
    assert chunk["k"][0][real].tolist() == [0, 1, 2, 3]


def test_trajectories_losing_unread_steps_are_dropped_with_a_warning():
    first, second = interleaved_collector_batches()
    rb = buffer(1, 4, capacity=8, traj_key=("collector", "traj_ids"))
    rb.extend(first)
    rb.extend(second)  # 12 steps in 8 slots: (0,0) (0,1) (0,2) (1,0) lost unread
    # whatever trajectory a lost step belonged to, nothing written after it is whole (the
    # tail of traj 0, k = 3 with its end flag, must not pass for a one-step episode)
    with pytest.warns(UserWarning, match="overwritten before any sample read them"):
        with pytest.raises(ValueError, match="no complete episode"):
            rb.sample()
    whole = first[:2].clone()  # a whole episode: traj 5
    whole["traj"] = whole["collector", "traj_ids"] = torch.tensor([5, 5])
    whole["next", "done"] = torch.tensor([[False], [True]])
    rb.extend(whole)
    assert rb.sample()["traj"].tolist() == [[5, 5, 5, 5]]


def test_an_empty_write_changes_nothing():
    rb = buffer(1, 4, replacement=False)
    rb.extend(episodes([3, 1]))
    rb.extend(episodes([2])[:0])  # e.g. a filter that kept no step of a batch
    chunk = rb.sample()
    assert sorted(chunk["obs"][0].tolist()) == [0, 1, 2, 3]


def test_flattened_collector_batches_replay_the_acting_memory():
    """A Collector over 3 envs acts with a ResetRNN; replaying its stored steps as stream
    chunks (trajectories stitched across batches, state carried across chunks) gives the
    acting outputs back at every step."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, InitTracker, SerialEnv, TransformedEnv
    from torchrl.modules import set_recurrent_mode

    from torchrl_seqchunk import ResetRNN

    actor = ResetRNN(nn.GRU(4, 8, batch_first=True), is_first_key="is_init")
    env = TransformedEnv(SerialEnv(3, lambda: GymEnv("CartPole-v1")), InitTracker())
    env.append_transform(actor.make_tensordict_primer())
    policy = TensorDictSequential(
        TensorDictModule(nn.Linear(4, 4), in_keys=["observation"], out_keys=["embed"]),
        actor,
        TensorDictModule(
            lambda f: nn.functional.one_hot((f[..., 0] > 0).long(), 2),
            in_keys=["features"], out_keys=["action"],
        ),
    )
    env.set_seed(0)
    rb = buffer(4, 10, capacity=1000, storage=LazyMemmapStorage, is_first_key="is_init",
                traj_key=("collector", "traj_ids"))
    collector = Collector(env, policy, frames_per_batch=60, total_frames=360)
    try:
        for batch in collector:  # [3 envs, 20 steps]
            rb.extend(batch.reshape(-1))
    finally:
        collector.shutdown()
    learner = ResetRNN(actor.rnn, is_first_key="is_init")
    starts = 0
    with torch.no_grad():
        for _ in range(12):
            chunk = rb.sample()
            starts += int(chunk["is_init"].sum())
            with set_recurrent_mode(True):
                replay = learner(chunk.exclude("features"))["features"]
            torch.testing.assert_close(replay, chunk["features"], atol=1e-5, rtol=0)
    assert starts > 4  # episodes ended and were concatenated


@settings(max_examples=25, deadline=None)
@given(
    num_envs=st.integers(1, 4),
    capacity=st.integers(8, 40),
    num_streams=st.integers(1, 3),
    seq_len=st.integers(1, 6),
    seed=st.integers(0, 2**31),
)
def test_interleaved_envs_in_a_ring_never_break_a_stream(
    num_envs, capacity, num_streams, seq_len, seed
):
    """Flattened [num_envs, T] batches into a ring, sampled and saved/restored in between:
    each stream continues a trajectory step by step or starts one at its first step."""
    g = torch.Generator().manual_seed(seed)
    rb = buffer(num_streams, seq_len, capacity=capacity, traj_key=("collector", "traj_ids"),
                generator=torch.Generator().manual_seed(seed))
    running = [[e, 0, int(torch.randint(1, 12, (1,), generator=g))] for e in range(num_envs)]
    next_traj, last = num_envs, None
    for _ in range(12):
        steps = max(1, min(int(torch.randint(1, 6, (1,), generator=g)), capacity // num_envs))
        traj, k, done = [], [], []
        for env in running:  # env after env, as batch.reshape(-1) lays them out
            for _ in range(steps):
                traj.append(env[0])
                k.append(env[1])
                done.append(env[1] == env[2] - 1)
                if done[-1]:
                    env[:] = [next_traj, 0, int(torch.randint(1, 12, (1,), generator=g))]
                    next_traj += 1
                else:
                    env[1] += 1
        rb.extend(TensorDict({
            "traj": torch.tensor(traj), "k": torch.tensor(k),
            ("collector", "traj_ids"): torch.tensor(traj),
            ("next", "done"): torch.tensor(done).unsqueeze(-1),
        }, [len(traj)]))
        if not rb.sampler.can_sample(rb.storage, num_streams * seq_len):
            continue
        chunk = rb.sample()
        traj, k = chunk["traj"], chunk["k"]
        first = chunk["is_first"].squeeze(-1)
        if last is not None:  # the previous chunk's last step leads each row
            traj, k = torch.cat([last[0], traj], 1), torch.cat([last[1], k], 1)
            first = torch.cat([torch.zeros_like(first[:, :1]), first], 1)
        assert (k[first] == 0).all()
        follows = (traj[:, 1:] == traj[:, :-1]) & (k[:, 1:] == k[:, :-1] + 1)
        assert (first[:, 1:] | follows).all()
        last = (chunk["traj"][:, -1:], chunk["k"][:, -1:])
        if int(torch.randint(3, (1,), generator=g)) == 0:
            rb.sampler.load_state_dict(rb.sampler.state_dict())
