import json
import random

import numpy as np
import pytest
import torch
from spawn_ranks import spawn
from tensordict import TensorDict
from torch import nn
from toy import chunk_loss, episodes, make_buffer, make_model

from torchrl_seqchunk import (
    ChunkPrefetcher,
    EvenEpochs,
    load_checkpoint,
    save_checkpoint,
)

SAVED_AT, STEPS = 3, 6  # iterations before the checkpoint, in all
WORKERS = [0, 1]


def write_episodes(buffer) -> None:
    """About 15 steps of new episodes, drawn from Python's, NumPy's and torch's global
    generators (a resumed run repeats them only if all three were restored)."""
    lengths = []
    while sum(lengths) < 15:
        lengths.append(random.randint(2, 7))
    obs = torch.from_numpy(np.random.randn(sum(lengths), 2)).float()
    buffer.extend(episodes(lengths, obs=obs))  # targets from torch's generator


def train(rank, world_size, out, resume):
    """Iterations: write episodes into a ring of 40 steps, then one even epoch of DDP
    steps (Adam, dropout). Uninterrupted: saves at SAVED_AT and goes on; resumed: new
    processes load that checkpoint and run the rest. Records what follows the checkpoint."""
    torch.manual_seed(0)
    buffer, (model, rnn) = make_buffer(rank, capacity=40), make_model(dropout=0.3)
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = torch.optim.Adam(ddp.parameters(), lr=0.01)
    even = EvenEpochs(buffer)
    random.seed(rank), np.random.seed(rank), torch.manual_seed(100 + rank)
    start = 0
    if resume:
        loaded = load_checkpoint(out / "checkpoint", buffer=buffer, model=ddp, optimizer=optim,
                                 workers=WORKERS)
        start = loaded["step"]
        assert loaded["extra"] == {"iteration": SAVED_AT}
    losses, indices = [], []
    for iteration in range(start, STEPS):
        if iteration == SAVED_AT and not resume:
            save_checkpoint(out / "checkpoint", step=iteration, buffer=buffer, model=ddp,
                            optimizer=optim, workers=WORKERS, extra={"iteration": iteration})
            losses, indices = [], []  # what follows the checkpoint
        write_episodes(buffer)
        with ChunkPrefetcher(even) as chunks:
            for chunk in chunks:
                loss = chunk_loss(ddp, chunk)
                optim.zero_grad()
                loss.backward()
                optim.step()
                losses.append(loss.item())
                indices.append(chunk["index"])
    torch.save({"losses": losses, "indices": indices, "model": model.state_dict(),
                "optim": optim.state_dict(), "carry": rnn._carry[0], "storage": buffer.storage[:]},
               out / f"{'resumed' if resume else 'uninterrupted'}{rank}.pt")


@pytest.mark.distributed
def test_a_two_rank_run_resumed_from_a_checkpoint_continues_bit_for_bit(tmp_path):
    spawn(train, tmp_path, False)  # runs on past the checkpoint
    spawn(train, tmp_path, True)  # new processes, from the checkpoint
    for rank in range(2):
        whole, resumed = (torch.load(tmp_path / f"{name}{rank}.pt", weights_only=False)
                          for name in ("uninterrupted", "resumed"))
        assert len(whole["losses"]) >= STEPS - SAVED_AT
        assert resumed["losses"] == whole["losses"]  # exactly, float for float
        for a, b in zip(resumed["indices"], whole["indices"]):
            assert torch.equal(a, b)
        for key, value in whole["model"].items():
            if key.endswith("_extra_state"):  # the carry
                assert torch.equal(resumed["model"][key]["carry"][0], value["carry"][0])
            else:
                assert torch.equal(resumed["model"][key], value), key
        assert torch.equal(resumed["carry"], whole["carry"])
        for a, b in zip(resumed["optim"]["state"].values(), whole["optim"]["state"].values()):
            assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
        assert (resumed["storage"] == whole["storage"]).all()
    # the ranks trained on different data, so their carries differ
    ranks = [torch.load(tmp_path / f"resumed{r}.pt", weights_only=False) for r in range(2)]
    assert not torch.equal(ranks[0]["carry"], ranks[1]["carry"])

    manifest = json.loads((tmp_path / "checkpoint" / "manifest.json").read_text())
    assert (manifest["world_size"], manifest["step"], manifest["workers"]) == (2, SAVED_AT, WORKERS)
    assert set(manifest["versions"]) == {"torchrl_seqchunk", "torch", "torchrl", "tensordict", "python"}
    model, _ = make_model()
    with pytest.raises(ValueError, match="world size changed: the checkpoint at .* was saved by "
                                         "2 ranks, this run has world_size=1"):
        load_checkpoint(tmp_path / "checkpoint", buffer=make_buffer(0), model=model,
                        optimizer=torch.optim.Adam(model.parameters()))


def test_incomplete_or_mismatched_checkpoints_are_refused(tmp_path):
    model, _ = make_model()
    optim, buffer = torch.optim.Adam(model.parameters()), make_buffer(0)
    buffer.extend(episodes([3, 4]))
    parts = {"buffer": buffer, "model": model, "optimizer": optim}
    with pytest.raises(FileNotFoundError, match="manifest.json not found"):
        load_checkpoint(tmp_path / "nothing", **parts)
    save_checkpoint(tmp_path / "one", step=1, workers=[0, 0], **parts)  # one rank, no process group
    with pytest.raises(ValueError, match=r"workers=\[0\] differs from the saved worker -> rank map \[0, 0\]"):
        load_checkpoint(tmp_path / "one", workers=[0], **parts)
    manifest = tmp_path / "one" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 1', '"step": 2'))
    with pytest.raises(ValueError, match="rank 0's files are of step 1, the manifest of step 2"):
        load_checkpoint(tmp_path / "one", **parts)
    with pytest.raises(ValueError, match=r"workers=\[0, 1\] names ranks outside \[0, world_size\) = \[0, 1\)"):
        save_checkpoint(tmp_path / "two", step=1, workers=[0, 1], **parts)
    with pytest.raises(TypeError, match="step must be an int, got 1.0"):
        save_checkpoint(tmp_path / "two", step=1.0, **parts)


@pytest.mark.parametrize(
    "extra, kind",
    [({"mean": np.zeros(3)}, "ndarray"), ({"norm": TensorDict(loc=torch.zeros(2))}, "TensorDict"),
     ({"scale": np.float64(1.0)}, "float64"), ({"f": len}, "builtin")],
)
def test_an_extra_that_would_not_load_back_is_refused_before_anything_is_written(tmp_path, extra, kind):
    # torch.save writes these, but load_checkpoint's torch.load(weights_only=True) refuses
    # them: the run would find its checkpoint unloadable only when resuming
    model, _ = make_model()
    optim, buffer = torch.optim.Adam(model.parameters()), make_buffer(0)
    buffer.extend(episodes([3, 4]))
    parts = {"buffer": buffer, "model": model, "optimizer": optim}
    save_checkpoint(tmp_path, step=1, extra={"iteration": 1}, **parts)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(TypeError, match=r"(?s)extra=.* cannot be saved and loaded back with "
                                        r"torch.load\(weights_only=True\).*torch.from_numpy"):
        save_checkpoint(tmp_path, step=2, extra=extra, **parts)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert load_checkpoint(tmp_path, **parts)["extra"] == {"iteration": 1}  # the old one


def test_a_damaged_manifest_an_empty_buffer_or_workers_not_a_list_are_named(tmp_path):
    model, _ = make_model()
    parts = {"buffer": make_buffer(0), "model": model, "optimizer": torch.optim.Adam(model.parameters())}
    with pytest.raises(ValueError, match=r"rank 0's buffer was never written to.*after the first rb.extend"):
        save_checkpoint(tmp_path, step=0, **parts)  # TorchRL's own error came after the writes began
    assert not any(tmp_path.iterdir())
    parts["buffer"].extend(episodes([3, 4]))
    with pytest.raises(TypeError, match=r"workers must be a list of ranks \(ints\), got 3; pass assign_workers"):
        save_checkpoint(tmp_path, step=1, workers=3, **parts)
    save_checkpoint(tmp_path, step=1, **parts)
    manifest = tmp_path / "manifest.json"
    for text, error in [("{bad", "JSONDecodeError"), ("{}", "KeyError: 'world_size'"), ("[1]", "TypeError")]:
        manifest.write_text(text)
        with pytest.raises(ValueError, match=rf"manifest.json is not a checkpoint manifest \({error}"):
            load_checkpoint(tmp_path, **parts)
