"""IndexSelectStorage / IndexSelectMemmapStorage read exactly what TorchRL's lazy storages read."""
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

from torchrl_seqchunk import IndexSelectMemmapStorage, IndexSelectStorage, StreamChunkSampler


def steps(n: int, start: int = 0) -> TensorDict:
    """``n`` steps whose every entry encodes its step number (uint8 images, nested keys, flags)."""
    t = torch.arange(start, start + n)
    done = (t % 7 == 6).unsqueeze(-1)
    return TensorDict({
        "observation": (t.view(-1, 1, 1, 1) % 251).to(torch.uint8).expand(n, 3, 4, 4).clone(),
        "action": t.unsqueeze(-1),
        ("next", "reward"): t.float().unsqueeze(-1) / 10,
        ("next", "done"): done,
    }, [n])


def pair(ours_class, reference_class, capacity, tmp_path=None):
    kwargs = [{}, {}] if tmp_path is None else [{"scratch_dir": tmp_path / "a"}, {"scratch_dir": tmp_path / "b"}]
    return ours_class(capacity, **kwargs[0]), reference_class(capacity, **kwargs[1])


@pytest.mark.parametrize("memmap", [False, True])
@pytest.mark.parametrize("index", [
    torch.tensor([3, 0, 9, 3]),                       # 1-D, repeated
    torch.tensor([[1, 2, 3], [8, 9, 0]]),             # [B, T]
    torch.tensor([-1, -10, 4]),                       # negative: from the end
    torch.tensor([[5, 6]], dtype=torch.int32),        # int32
])
def test_tensor_index_matches_torchrl(memmap, index, tmp_path):
    classes = (IndexSelectMemmapStorage, LazyMemmapStorage) if memmap else (IndexSelectStorage, LazyTensorStorage)
    ours, reference = pair(*classes, 20, tmp_path if memmap else None)
    for storage in (ours, reference):
        storage.set(torch.arange(10), steps(10))  # 10 of 20 slots: the storage is not full
    got, expected = ours.get(index), reference.get(index)
    assert got.batch_size == expected.batch_size == index.shape
    assert (got == expected).all()
    # hand-computed: step k holds action k
    assert got["action"].squeeze(-1).tolist() == (index.long() % 10).tolist()


def test_full_ring_storage_after_wrap():
    ours, reference = pair(IndexSelectStorage, LazyTensorStorage, 8)
    for storage in (ours, reference):
        storage.set(torch.arange(8), steps(8))
        storage.set(torch.arange(3), steps(3, start=8))  # slots 0-2 rewritten with steps 8-10
    index = torch.tensor([[0, 1, 2, 3], [7, 6, 5, 4]])
    assert (ours[index] == reference[index]).all()
    assert ours[index]["action"].squeeze(-1).tolist() == [[8, 9, 10, 3], [7, 6, 5, 4]]


@pytest.mark.parametrize("index", [4, slice(2, 6), [1, 5], torch.tensor([True, False] * 5)])
def test_other_indexes_are_torchrl_s(index):
    ours, reference = pair(IndexSelectStorage, LazyTensorStorage, 10)
    for storage in (ours, reference):
        storage.set(torch.arange(10), steps(10))
    assert (ours.get(index) == reference.get(index)).all()


def test_out_of_range_raises_index_error():
    ours = IndexSelectStorage(20)
    ours.set(torch.arange(10), steps(10))
    with pytest.raises(IndexError):
        ours.get(torch.tensor([10]))  # slot 10 is not written yet
    with pytest.raises(IndexError):
        ours.get(torch.tensor([-11]))


def test_tensor_storage_and_two_dim_storage():
    ours, reference = IndexSelectStorage(6), LazyTensorStorage(6)
    for storage in (ours, reference):  # a plain tensor, not a TensorDict
        ReplayBuffer(storage=storage, batch_size=2).extend(torch.arange(12.0).view(6, 2))
    index = torch.tensor([[5, 0], [2, 2]])
    assert torch.equal(ours.get(index), reference.get(index))
    ours, reference = IndexSelectStorage(10, ndim=2), LazyTensorStorage(10, ndim=2)
    data = TensorDict({"x": torch.arange(10).view(5, 2)}, [5, 2])  # [time, env]
    for storage in (ours, reference):
        storage.set(torch.arange(5), data)
    index = torch.tensor([4, 0, 2])
    assert ours.get(index).batch_size == reference.get(index).batch_size == (3, 2)
    assert (ours.get(index) == reference.get(index)).all()


def test_stream_chunks_identical_on_both_storages():
    """The same sampler seed over both storages: the same chunks, flags and index."""
    buffers = [
        TensorDictReplayBuffer(storage=storage, batch_size=12,
                               sampler=StreamChunkSampler(3, 4, generator=torch.Generator().manual_seed(1)))
        for storage in (IndexSelectStorage(40), LazyTensorStorage(40))
    ]
    for rb in buffers:
        rb.extend(steps(35))
    for _ in range(5):
        got, expected = (rb.sample() for rb in buffers)
        assert got.batch_size == expected.batch_size == (3, 4)
        assert set(got.keys(True)) == set(expected.keys(True))
        assert (got == expected).all()


@pytest.mark.parametrize("storage_class", [IndexSelectStorage, IndexSelectMemmapStorage])
def test_checkpoint_round_trip(storage_class, tmp_path):
    """TorchRL's checkpointers take these storages: dumps then loads gives the same chunks."""
    def buffer():
        return TensorDictReplayBuffer(storage=storage_class(40), batch_size=8,
                                      sampler=StreamChunkSampler(2, 4, generator=torch.Generator().manual_seed(3)))
    saved, loaded = buffer(), buffer()
    saved.extend(steps(30))
    saved.dumps(tmp_path)
    loaded.loads(tmp_path)
    assert type(loaded.storage) is storage_class and len(loaded) == 30
    for _ in range(3):
        assert (saved.sample() == loaded.sample()).all()


def other_layouts() -> dict:
    """Layouts read by TorchRL's gather (10 steps each)."""
    names = TensorDict({"x": torch.arange(20).view(10, 2)}, [10, 2], names=["time", "env"])
    agents = TensorDict({"agents": TensorDict({"obs": torch.arange(40.0).view(10, 4)}, [10, 4]),
                         "a": torch.arange(10)}, [10])
    text = TensorDict({"a": torch.arange(10)}, [10])
    text.set_non_tensor("note", "hi")
    return {"names": names, "nested batch dims": agents, "non-tensor": text}


@pytest.mark.parametrize("layout", ["names", "nested batch dims", "non-tensor"])
def test_other_layouts_read_as_torchrl_does(layout):
    data = other_layouts()[layout]
    ours, reference = pair(IndexSelectStorage, LazyTensorStorage, 20)
    for storage in (ours, reference):
        storage.set(torch.arange(10), data)
    index = torch.tensor([[3, 0], [9, 9]])
    got, expected = ours.get(index), reference.get(index)
    assert got.batch_size == expected.batch_size and got.names == expected.names
    assert set(got.keys(True, True)) == set(expected.keys(True, True))
    assert (got.exclude("note") == expected.exclude("note")).all()
    if layout == "nested batch dims":
        assert got["agents"].batch_size == (2, 2, 4)
    if layout == "non-tensor":
        assert list(map(list, got["note"])) == list(map(list, expected["note"])) == [["hi", "hi"]] * 2


def test_errors_are_torchrl_s():
    ours, reference = pair(IndexSelectStorage, LazyTensorStorage, 20)
    for storage in (ours, reference):
        storage.set(torch.arange(10), steps(10))
    messages = []
    for storage in (ours, reference):
        with pytest.raises(IndexError) as error:
            storage.get(torch.tensor([2, 10]))
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    for storage in (ours, reference):  # emptied, as rb.empty() does
        storage._empty()
        with pytest.raises(IndexError):
            storage.get(torch.tensor([0]))
