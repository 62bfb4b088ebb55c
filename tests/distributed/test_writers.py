import pickle

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from torchrl_seqchunk import StreamChunkSampler, TagTrajectories

TRAJ = ("collector", "traj_ids")


def batch(obs, traj, done):
    n = len(obs)
    return TensorDict(
        {"obs": torch.tensor(obs), TRAJ: torch.tensor(traj),
         ("next", "done"): torch.tensor(done, dtype=torch.bool).reshape(n, 1)},
        [n],
    )


def two_workers_batches():
    """Two workers, each numbering its trajectories from 0 (as RayCollector workers do),
    two batches each, written interleaved: w0 A, w1 A, w0 B, w1 B. obs 0.. are worker 0's
    steps, obs 100.. worker 1's. Whole episodes: w0 (0 1 2) (3 4 5 6), w1 (100 101)
    (102 103 104); w1's trajectory 2 (obs 105) still runs."""
    return [
        (0, batch([0, 1, 2, 3, 4], [0, 0, 0, 1, 1], [0, 0, 1, 0, 0])),
        (1, batch([100, 101, 102, 103], [0, 0, 1, 1], [0, 1, 0, 0])),
        (0, batch([5, 6], [1, 1], [0, 1])),
        (1, batch([104, 105], [1, 2], [1, 0])),
    ]


def read_episodes(tags):
    """The episodes one epoch of a 1-stream sampler emits, split where is_first is True."""
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=StreamChunkSampler(1, 12, traj_key=TRAJ, replacement=False, seed=0),
        batch_size=12,
    )
    for worker, data in two_workers_batches():
        rb.extend(tags[worker](data) if tags else data)
    chunk = rb.sample()
    assert chunk["collector", "mask"].all()  # 12 steps of whole episodes: no padding
    obs, first = chunk["obs"][0].tolist(), chunk["is_first"][0, :, 0].tolist()
    starts = [t for t in range(12) if first[t]] + [12]
    return {tuple(obs[a:b]) for a, b in zip(starts, starts[1:])}


def test_tagged_workers_interleaved_in_one_buffer_give_whole_episodes():
    tags = [TagTrajectories(w, 2) for w in range(2)]
    assert read_episodes(tags) == {(0, 1, 2), (3, 4, 5, 6), (100, 101), (102, 103, 104)}
    # untagged, worker 1's trajectory 1 joins worker 0's running trajectory 1
    assert (3, 4, 102, 103, 5, 6) in read_episodes(None)


def test_tag_values_shapes_and_pickling():
    tag = pickle.loads(pickle.dumps(TagTrajectories(2, 3)))
    data = TensorDict({TRAJ: torch.tensor([[0, 0, 1], [2, 2, 2]])}, [2, 3])  # [envs, T]
    out = tag(data)
    assert out is data
    assert out[TRAJ].tolist() == [[2, 2, 5], [8, 8, 8]] and out[TRAJ].dtype == torch.long
    other = TagTrajectories(0, 1, traj_key="tid")(TensorDict({"tid": torch.tensor([4])}, [1]))
    assert other["tid"].tolist() == [4]  # one worker: ids unchanged
    assert repr(tag) == "TagTrajectories(worker=2, num_workers=3, traj_key=('collector', 'traj_ids'))"


@pytest.mark.parametrize(
    "args, data, error, words",
    [
        ((2, 2), None, ValueError, r"worker must be in \[0, 1\], got 2"),
        ((0, 0), None, ValueError, "num_workers must be >= 1, got 0"),
        ((True, 2), None, TypeError, r"worker must be an int in \[0, 1\], got True"),
        ((0, 2.0), None, TypeError, "num_workers must be an int >= 1, got 2.0"),
        ((0, 2), {"obs": torch.zeros(2)}, ValueError, r"traj_key \('collector', 'traj_ids'\) not found"),
        ((0, 2), {TRAJ: torch.tensor([0.0, 1.0])}, TypeError, "must hold integer ids, got dtype torch.float32"),
        ((0, 2), {TRAJ: torch.tensor([0, -1])}, ValueError, r"negative ids \(smallest -1\)"),
        # 2**62 * 2 + 1 wrapped to -2**63 + 1, onto another trajectory's id
        ((1, 2), {TRAJ: torch.tensor([0, 2**62])}, ValueError, r"would pass int64's range \(at most 4611686018427387903"),
    ],
)
def test_bad_arguments_and_batches(args, data, error, words):
    with pytest.raises(error, match=words):
        TagTrajectories(*args)(TensorDict(data, [2]))


def test_narrow_id_dtypes_are_tagged_in_int64_and_bool_ids_refused():
    ids = torch.tensor([2**30, 5], dtype=torch.int32)  # 2**30 * 4 + 1 overflows int32
    out = TagTrajectories(1, 4)(TensorDict({("collector", "traj_ids"): ids}, [2]))
    assert out["collector", "traj_ids"].dtype == torch.long
    assert out["collector", "traj_ids"].tolist() == [2**32 + 1, 21]
    assert ids.tolist() == [2**30, 5]  # the tensor the batch held is left as it was (a new one is set)
    assert TagTrajectories(1, 2)(TensorDict({("collector", "traj_ids"): torch.tensor([2**62 - 1])}, [1]))[
        "collector", "traj_ids"].tolist() == [2**63 - 1]  # the largest id that fits
    with pytest.raises(TypeError, match="integer ids"):
        TagTrajectories(1, 4)(TensorDict({("collector", "traj_ids"): torch.tensor([True, False])}, [2]))
