import itertools

import pytest
import torch
from spawn_ranks import spawn
from torch import nn
from toy import chunk_loss, episodes, make_buffer, make_model
from waiting import wait_for  # tests/waiting.py

from torchrl_seqchunk import ChunkPrefetcher, EvenEpochs, assign_workers, rank_seed

KEYS = ("obs", "target", "is_first", ("collector", "mask"))
LR = 0.1


def train_ddp(rank, world_size, out, lengths, epochs):
    """Rank `rank` fills its buffer with episodes of `lengths[rank]` (data seeded by the
    rank), then trains its DDP replica on `epochs` even epochs, prefetched in a thread;
    saves the chunks it trained on, its (own, agreed) counts, parameters and carry."""
    buffer = make_buffer(rank)
    buffer.extend(episodes(lengths[rank], torch.Generator().manual_seed(100 + rank)))
    torch.manual_seed(0)  # the same initial weights on every rank
    model, rnn = make_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.SGD(ddp.parameters(), lr=LR)
    even, counts, chunks = EvenEpochs(buffer), [], []

    def source():
        for _ in range(epochs):
            yield from even
            counts.append((even.own, even.count))

    with ChunkPrefetcher(source()) as prefetched:
        for chunk in prefetched:
            chunks.append(chunk.select(*KEYS).clone())
            optim.zero_grad()
            chunk_loss(ddp, chunk).backward()
            optim.step()
    result = {"chunks": chunks, "counts": counts, "params": [p.detach() for p in model.parameters()],
              "carry": rnn._carry[0]}
    if rank == 1:  # every episode gone, one unfinished left: no chunk to give
        buffer.empty()
        buffer.extend(episodes([3])[:2])
    try:
        next(iter(even))
    except ValueError as error:
        result["error"] = str(error)
    torch.save(result, out / f"rank{rank}.pt")


# B = 2 streams, T = 4. Longest first to the shorter stream: rank 0 deals 5, 5, 5, 5 into
# streams of 10 and 10 steps -> ceil(10 / 4) = 3 chunks; rank 1 deals 9, 7, 6, 6, 5, 5, 4
# into 9+6+5 = 20 and 7+6+5+4 = 22 steps -> ceil(22 / 4) = 6 chunks.
LENGTHS = [[5, 5, 5, 5], [9, 7, 6, 6, 5, 5, 4]]
EPOCHS = 3


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The results of 2 gloo ranks trained on LENGTHS for EPOCHS even epochs."""
    out = tmp_path_factory.mktemp("ranks")
    spawn(train_ddp, out, LENGTHS, EPOCHS)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.distributed
def test_ddp_ranks_keep_equal_weights_and_their_own_carries(ranks):
    steps = len(ranks[0]["chunks"])
    assert steps == len(ranks[1]["chunks"]) == 9
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)  # the same weights, bit for bit

    # reference without torch.distributed: one replica per rank, same initial weights, each
    # on its rank's chunks; the gradient of a step is the mean of the replicas' gradients
    torch.manual_seed(0)
    replicas = [make_model() for _ in range(2)]
    replicas[1][0].load_state_dict(replicas[0][0].state_dict())
    initial = [p.detach().clone() for p in replicas[0][0].parameters()]
    for step in range(steps):
        grads = []
        for r, (model, _) in enumerate(replicas):
            model.zero_grad()
            chunk_loss(model, ranks[r]["chunks"][step].clone()).backward()
            grads.append([p.grad for p in model.parameters()])
        with torch.no_grad():
            for (model, _) in replicas:
                for p, g0, g1 in zip(model.parameters(), *grads):
                    p -= LR * (g0 + g1) / 2
    for got, want, start in zip(ranks[0]["params"], replicas[0][0].parameters(), initial):
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)
        assert not torch.equal(got, start)  # it trained
    # each rank carries its own streams' state: that of its replica, not the other's
    for r in range(2):
        torch.testing.assert_close(ranks[r]["carry"], replicas[r][1]._carry[0], rtol=0, atol=1e-6)
    assert (ranks[0]["carry"] - ranks[1]["carry"]).abs().max() > 1e-3


@pytest.mark.distributed
def test_uneven_ranks_take_the_fewest_chunks_every_epoch(ranks):
    # every epoch is a new deal (own count back to the full epoch), cut to min(3, 6) = 3
    assert ranks[0]["counts"] == [(3, 3)] * EPOCHS
    assert ranks[1]["counts"] == [(6, 3)] * EPOCHS
    for r in range(2):
        assert len(ranks[r]["chunks"]) == 3 * EPOCHS
        for epoch in range(EPOCHS):  # each epoch starts with an episode start in every stream
            assert ranks[r]["chunks"][3 * epoch]["is_first"][:, 0].all()


@pytest.mark.distributed
def test_a_rank_without_episodes_fails_on_every_rank(ranks):
    # rank 1's buffer then holds no whole episode: it raises the sampler's error, rank 0
    # names the agreed count 0, and both processes end (no collective left waiting)
    assert "found no complete episode" in ranks[1]["error"]
    assert "the ranks agreed on 0 chunks" in ranks[0]["error"]


def test_even_epochs_refuses_a_sampler_with_replacement_and_other_buffers():
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

    from torchrl_seqchunk import StreamChunkSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=StreamChunkSampler(1, 2),
                                batch_size=2)
    with pytest.raises(ValueError, match="replacement=True, whose epochs never end"):
        EvenEpochs(rb)
    with pytest.raises(TypeError, match="sampler must be a StreamChunkSampler, got RandomSampler"):
        EvenEpochs(ReplayBuffer(storage=LazyTensorStorage(10)))
    with pytest.raises(TypeError, match=r"buffer must be a TorchRL ReplayBuffer \(e.g. TensorDictReplayBuffer\), got TensorDict"):
        EvenEpochs(TensorDict())


def test_an_epoch_left_early_is_drawn_off_before_the_next():
    """A break after one chunk (a KL stop, a prefetcher closed early): the next epoch is a
    whole one, every step once, not the rest of the one left."""
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from torchrl_seqchunk import StreamChunkSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8,
                                sampler=StreamChunkSampler(2, 4, replacement=False, seed=0))
    done = (torch.arange(20) % 5 == 4).unsqueeze(-1)  # 4 episodes of 5 steps: 2 streams of 10, 3 chunks
    rb.extend(TensorDict({"obs": torch.arange(20), ("next", "done"): done}, [20]))
    even = EvenEpochs(rb)

    def whole_epoch():
        epoch = list(even)
        steps = torch.cat([chunk["obs"][chunk["collector", "mask"]] for chunk in epoch])
        assert (len(epoch), even.own, sorted(steps.tolist())) == (3, 3, list(range(20)))

    for left_after in (1, 2, 3):
        for i, _ in enumerate(even):
            if i + 1 == left_after:
                break
        whole_epoch()
    for depth in (1, 2, 3):  # a prefetcher draws ahead, then puts the sampler back at the chunk it delivered
        with ChunkPrefetcher(even, depth=depth) as prefetched:
            next(prefetched)
            wait_for(lambda: prefetched._queue.full() or not prefetched._thread.is_alive(), "the worker drawing ahead")
        whole_epoch()
    for _ in even:  # left early, then the buffer emptied and written anew: nothing of the old epoch to draw off
        break
    rb.empty()
    rb.extend(TensorDict({"obs": torch.arange(20), ("next", "done"): done}, [20]))
    whole_epoch()


def test_assign_workers_round_robin_and_rank_seeds():
    assert assign_workers(4, 2) == [0, 1, 0, 1]
    assert assign_workers(3, 3) == [0, 1, 2]
    assert assign_workers(1, 1) == [0]
    with pytest.raises(ValueError, match="num_workers=1 is less than world_size=2"):
        assign_workers(1, 2)
    with pytest.raises(TypeError, match="world_size must be an int >= 1, got True"):
        assign_workers(2, True)
    # NumPy's SeedSequence child streams, as an independent reference
    import numpy as np

    want = np.random.SeedSequence(3, spawn_key=(1,)).generate_state(1, np.uint64)[0]
    assert rank_seed(3, 1) == int(want)
    want = np.random.SeedSequence(3, spawn_key=(1, 2)).generate_state(1, np.uint64)[0]
    assert rank_seed(3, 1, stream=2) == int(want) and rank_seed(3, 1, stream=0) == rank_seed(3, 1)
    seeds = {rank_seed(s, r, stream=k) for s, r, k in itertools.product(range(3), range(4), range(3))}
    assert len(seeds) == 36  # no two (seed, rank, stream) share a seed
    with pytest.raises(ValueError, match="rank must be >= 0, got -1"):
        rank_seed(0, -1)
    with pytest.raises(ValueError, match="stream must be >= 0, got -1"):
        rank_seed(0, 1, stream=-1)
