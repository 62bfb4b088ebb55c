import json
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from toy import chunk_loss, episodes, make_buffer, make_model

from torchrl_seqchunk import (
    ChunkPrefetcher,
    EvenEpochs,
    StreamChunkSampler,
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


class Killed(BaseException):
    """The job killed (SIGKILL) at this point: no rank runs another line."""


def act_as_rank(monkeypatch, rank: int, collectives_done: int | None = None) -> None:
    """This process plays rank ``rank`` of 2 whose peer takes part in its first
    ``collectives_done`` collectives (all when None, reporting no failure), after which
    the job is killed while this rank waits in the next one."""
    calls = []

    def collective(*args, **kwargs):
        calls.append(1)
        if collectives_done is not None and len(calls) > collectives_done:
            raise Killed

    for name, value in [("is_initialized", lambda: True), ("get_rank", lambda group=None: rank),
                        ("get_world_size", lambda group=None: 2),
                        ("get_backend", lambda group=None: "gloo"),
                        ("all_reduce", collective), ("barrier", collective)]:
        monkeypatch.setattr(dist, name, value)


def test_a_save_killed_after_a_rank_wrote_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    model, _ = make_model()
    parts = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    buffers = [make_buffer(rank) for rank in range(2)]
    for rank, buffer in reversed(list(enumerate(buffers))):  # a complete 2-rank checkpoint
        # of step 1; rank 0 last, as it writes the manifest after every rank wrote
        buffer.extend(episodes([3, 4]))
        with monkeypatch.context() as m:
            act_as_rank(m, rank)
            save_checkpoint(tmp_path, step=1, buffer=buffer, **parts)
    buffers[1].extend(episodes([2, 5]))  # 7 + 7 steps by step 2

    def dumps_then_killed(folder):  # the job dies right after rank 1's buffer is written
        type(buffers[1]).dumps(buffers[1], folder)
        raise Killed

    monkeypatch.setattr(buffers[1], "dumps", dumps_then_killed)
    # rank 1 checked its arguments with rank 0 and wrote its buffer of step 2, then the job
    # was killed: the manifest still names the files of step 1
    with monkeypatch.context() as m, pytest.raises(Killed):
        act_as_rank(m, 1, collectives_done=1)
        save_checkpoint(tmp_path, step=2, buffer=buffers[1], **parts)
    with monkeypatch.context() as m:
        act_as_rank(m, 1)
        resumed = make_buffer(1)
        loaded = load_checkpoint(tmp_path, buffer=resumed, **parts)
    # the old checkpoint, whole: step 1 with rank 1's 7 steps, not its 14 of step 2
    assert loaded["step"] == 1 and len(resumed) == 7


def test_a_load_that_does_not_fit_changes_nothing(tmp_path):
    model, _ = make_model()
    optim, buffer = torch.optim.Adam(model.parameters()), make_buffer(0)
    buffer.extend(episodes([3, 4]))
    optim.zero_grad()
    chunk_loss(model, buffer.sample()).backward()
    optim.step()
    save_checkpoint(tmp_path, step=1, buffer=buffer, model=model, optimizer=optim)

    def run(*, streams=2, capacity=100, out_features=1, two_groups=False, optimizer=torch.optim.Adam, **hyper):
        """A run to resume: 4 steps already in its buffer, a model of another seed."""
        torch.manual_seed(1)
        buffer = make_buffer(0, streams=streams, capacity=capacity)
        buffer.extend(episodes([2, 2]))
        model, _ = make_model()
        model[2].module[1] = nn.Linear(4, out_features)
        params = list(model.parameters())
        groups = [{"params": params[:2]}, {"params": params[2:]}] if two_groups else params
        return buffer, model, optimizer(groups, **hyper)

    cases = [
        ({"out_features": 2}, r"model does not fit rank 0's saved model \(other shapes "
                              r"\['module.2.module.1.weight: saved \[1, 4\], here \[2, 4\]', "
                              r"'module.2.module.1.bias: saved \[1\], here \[2\]'\]\)"),
        ({"two_groups": True}, r"optimizer does not fit rank 0's saved optimizer \(ValueError: loaded state "
                        r"dict has a different number of parameter groups\)"),
        ({"streams": 3}, r"\(num_streams, seq_len\) = \(2, 4\), this sampler has \(3, 4\)"),
        # TorchRL's loads failed deep in tensordict, after the other parts' checks had passed
        ({"capacity": 50}, r"buffer's storage is \{.*'max_size': 50\}, rank 0 saved \{.*'max_size': 100\}"),
        # Adam's state loads into any optimizer class: SGD's first step() raised KeyError
        ({"optimizer": torch.optim.SGD, "lr": 0.1},
         r"optimizer is a torch.optim.sgd.SGD, rank 0 saved a torch.optim.adam.Adam"),
        ({"optimizer": torch.optim.AdamW}, r"optimizer is a torch.optim.adamw.AdamW"),
        ({"weight_decay": 0.1}, r"hyperparameters differ .*\(group 0 weight_decay: saved 0, here 0.1\)"),
    ]
    for options, error in cases:
        buffer, model, optim = run(**options)
        steps, rng = buffer.storage[:].clone(), torch.get_rng_state()
        weights = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        with pytest.raises(ValueError, match=error):
            load_checkpoint(tmp_path, buffer=buffer, model=model, optimizer=optim)
        # as they were: the buffer's 4 steps, the model's weights, no optimizer state, the generator
        assert len(buffer) == 4 and (buffer.storage[:] == steps).all()
        assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
        assert optim.state_dict()["state"] == {}
        assert torch.equal(torch.get_rng_state(), rng)


def test_parts_of_the_wrong_kind_are_named_before_anything_is_written_or_loaded(tmp_path):
    model, _ = make_model()
    optim, buffer = torch.optim.Adam(model.parameters()), make_buffer(0)
    buffer.extend(episodes([3, 4]))
    parts = {"buffer": buffer, "model": model, "optimizer": optim}
    for name in parts:
        wrong = {**parts, name: None}
        with pytest.raises(TypeError, match=f"{name} must be .*, got NoneType"):
            save_checkpoint(tmp_path / "never", step=1, **wrong)
        assert not (tmp_path / "never").exists()
    save_checkpoint(tmp_path, step=1, **parts)
    for name in parts:
        with pytest.raises(TypeError, match=f"{name} must be .*, got NoneType"):
            load_checkpoint(tmp_path, **{**parts, name: None})


def test_a_different_lr_is_restored_from_the_checkpoint(tmp_path):
    model, _ = make_model()
    buffer = make_buffer(0)
    buffer.extend(episodes([3, 4]))
    save_checkpoint(tmp_path, step=1, buffer=buffer, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.5))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)  # e.g. a scheduler's value
    load_checkpoint(tmp_path, buffer=make_buffer(0), model=model, optimizer=optim)
    assert optim.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("optimizer, options", [(torch.optim.Adam, {}), (torch.optim.SGD, {"momentum": 0.9})])
def test_a_momentum_a_one_cycle_schedule_moved_is_restored_too(tmp_path, optimizer, options):
    def run():
        model, _ = make_model()
        optim = optimizer(model.parameters(), lr=1e-3, **options)
        return model, optim, torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=1e-2, total_steps=100)

    model, optim, schedule = run()
    buffer = make_buffer(0)
    buffer.extend(episodes([3, 4]))
    for _ in range(10):
        optim.step()
        schedule.step()
    save_checkpoint(tmp_path, step=10, buffer=buffer, model=model, optimizer=optim)
    model2, optim2, _ = run()  # built anew: its momentum at the cycle's start
    load_checkpoint(tmp_path, buffer=make_buffer(0), model=model2, optimizer=optim2)
    key = "betas" if optimizer is torch.optim.Adam else "momentum"
    assert optim2.param_groups[0][key] == optim.param_groups[0][key] != run()[1].param_groups[0][key]
    if key == "betas":  # beta2 is not cycled: another one is still refused
        other, _ = make_model()
        cycled = torch.optim.Adam(other.parameters(), lr=1e-3, betas=(0.9, 0.99))
        torch.optim.lr_scheduler.OneCycleLR(cycled, max_lr=1e-2, total_steps=100)
        with pytest.raises(ValueError, match=r"group 0 betas: saved \(0.999,\), here \(0.99,\)"):
            load_checkpoint(tmp_path, buffer=make_buffer(0), model=other, optimizer=cycled)
    # without a cycling scheduler a momentum of its own is still refused
    other, _ = make_model()
    with pytest.raises(ValueError, match=f"hyperparameters differ .*group 0 {key}"):
        load_checkpoint(tmp_path, buffer=make_buffer(0), model=other,
                        optimizer=optimizer(other.parameters(), lr=1e-3, **{**options, key: (0.5, 0.9) if key == "betas" else 0.5}))


@pytest.mark.parametrize("field, value", [("world_size", True), ("step", 1.0), ("workers", [True])])
def test_a_manifest_field_of_the_wrong_type_is_refused(tmp_path, field, value):
    model, _ = make_model()
    parts = {"buffer": make_buffer(0), "model": model, "optimizer": torch.optim.Adam(model.parameters())}
    parts["buffer"].extend(episodes([3, 4]))
    save_checkpoint(tmp_path, step=1, **parts)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), field: value}))
    with pytest.raises(ValueError, match=rf"manifest.json is not a checkpoint manifest \(TypeError: {field}"):
        load_checkpoint(tmp_path, **parts)


def test_a_save_that_crashes_midway_leaves_the_old_checkpoint_loadable(tmp_path, monkeypatch):
    model, _ = make_model()
    parts = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    buffer = make_buffer(0)
    buffer.extend(episodes([3, 4]))
    save_checkpoint(tmp_path, step=1, buffer=buffer, **parts)
    buffer.extend(episodes([2, 5]))

    save = torch.save

    def killed_at_state(obj, where, *args, **kwargs):  # the process dies writing state.pt
        if str(where).endswith("state.pt"):
            raise Killed
        save(obj, where, *args, **kwargs)

    monkeypatch.setattr(torch, "save", killed_at_state)
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, step=2, buffer=buffer, **parts)
    monkeypatch.undo()
    resumed = make_buffer(0)
    assert load_checkpoint(tmp_path, buffer=resumed, **parts)["step"] == 1
    assert len(resumed) == 7  # the 3 + 4 steps of step 1
    save_checkpoint(tmp_path, step=2, buffer=buffer, **parts)  # the next save goes through
    assert load_checkpoint(tmp_path, buffer=make_buffer(0), **parts)["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data2", "manifest.json"]


def test_a_save_while_prefetching_resumes_after_the_last_delivered_chunk(tmp_path):
    def make():
        buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(100),
                                        sampler=StreamChunkSampler(2, 4, seed=0), batch_size=8)
        buffer.extend(episodes([5, 7, 3, 6], generator=torch.Generator().manual_seed(0)))
        return buffer

    model, _ = make_model()
    parts = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    reference = make()
    expected = [reference.sample()["index"] for _ in range(4)]
    buffer = make()
    with ChunkPrefetcher(buffer.sample, depth=2) as chunks:
        assert torch.equal(next(chunks)["index"], expected[0])
        assert torch.equal(next(chunks)["index"], expected[1])
        save_checkpoint(tmp_path, step=2, buffer=buffer, prefetcher=chunks, **parts)
    with pytest.raises(ValueError, match="prefetcher does not draw from buffer's sampler"):
        with ChunkPrefetcher(buffer.sample) as other:
            save_checkpoint(tmp_path, step=3, buffer=make(), prefetcher=other, **parts)
    resumed = make()
    load_checkpoint(tmp_path, buffer=resumed, **parts)
    for want in expected[2:]:  # not the chunks the prefetcher had drawn ahead
        assert torch.equal(resumed.sample()["index"], want)


def fail_on_rank_1(rank, world_size, out):
    """Rank 1 fails in turn: saving a buffer never written to, writing where a file blocks its
    folder, loading into a model of another shape; then every rank saves and loads. Records,
    after each call on each rank, what it raised and whether the manifest exists."""
    torch.manual_seed(0)
    model, _ = make_model()
    parts = {"model": model, "optimizer": torch.optim.Adam(model.parameters())}
    buffer, path, calls = make_buffer(rank), out / "checkpoint", []
    if rank == 0:
        buffer.extend(episodes([3, 4]))

    def record(call):
        try:
            call()
            calls.append([None, (path / "manifest.json").exists()])
        except Exception as error:
            calls.append([f"{type(error).__name__}: {error}", (path / "manifest.json").exists()])

    record(lambda: save_checkpoint(path, step=1, buffer=buffer, **parts))
    if rank == 1:
        buffer.extend(episodes([2, 3]))
        (path / "data1").mkdir(parents=True)
        (path / "data1" / "rank1").write_text("not a folder")
    record(lambda: save_checkpoint(path, step=2, buffer=buffer, **parts))
    if rank == 1:
        (path / "data1" / "rank1").unlink()
    record(lambda: save_checkpoint(path, step=3, buffer=buffer, **parts))
    other, _ = make_model()
    if rank == 1:
        other[2].module[1] = nn.Linear(4, 2)
    record(lambda: load_checkpoint(path, buffer=make_buffer(rank), model=other,
                                   optimizer=torch.optim.Adam(other.parameters())))
    resumed = make_buffer(rank)
    step = load_checkpoint(path, buffer=resumed, **parts)["step"]
    (out / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "step": step, "steps": len(resumed)}))


@pytest.mark.distributed
def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path):
    spawn(fail_on_rank_1, tmp_path, timeout=90)  # without the agreement rank 0 waits forever
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    path = tmp_path / "checkpoint"
    failed = "RuntimeError: rank(s) [1] failed while {} (their own errors say why and how to fix it); {}"
    untouched = f"nothing was written: a checkpoint at {path} is as it was."
    kept = f"the checkpoint at {path} is as it was (the new files are under no manifest)."
    unloaded = "nothing was loaded: the buffer, model, optimizer and random generators of every rank are as they were."
    assert rank0["calls"] == [
        [failed.format("checking the arguments of save_checkpoint", untouched), False],
        [failed.format("writing its files", kept), False],
        [None, True],
        [failed.format(f"checking the checkpoint at {path}", unloaded), True],
    ]
    errors, manifest = zip(*rank1["calls"])
    assert errors[0].startswith("ValueError: rank 1's buffer was never written to")
    assert errors[1] == f"FileExistsError: [Errno 17] File exists: '{path / 'data1' / 'rank1'}'"
    assert errors[2] is None
    assert errors[3].startswith("ValueError: model does not fit rank 1's saved model (other shapes")
    assert manifest == (False, False, True, True)
    # the checkpoint of step 3: rank 0's 3 + 4 steps, rank 1's 2 + 3
    assert (rank0["step"], rank0["steps"], rank1["step"], rank1["steps"]) == (3, 7, 3, 5)


def save_at_rank_steps(rank, world_size, out):
    """Each rank saves at its own step (a rank one step ahead): every rank must refuse."""
    torch.manual_seed(0)
    model, _ = make_model()
    buffer = make_buffer(rank)
    buffer.extend(episodes([3, 4]))
    try:
        save_checkpoint(out / "checkpoint", step=1 + rank, buffer=buffer, model=model,
                        optimizer=torch.optim.Adam(model.parameters()))
        result = None
    except Exception as error:
        result = f"{type(error).__name__}: {error}"
    (out / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.distributed
def test_ranks_saving_different_steps_are_refused_on_every_rank(tmp_path):
    spawn(save_at_rank_steps, tmp_path, timeout=90)
    for rank in range(2):
        error = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert error.startswith(f"ValueError: the ranks called save_checkpoint with different step or workers, "
                                f"or see different checkpoints at the path (rank {rank}: step {1 + rank},"), error
    assert not (tmp_path / "checkpoint" / "manifest.json").exists()
