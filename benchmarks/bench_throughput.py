"""The main job's frames per second beside its incumbent and its limits, every figure from one run.

The main job (``seqchunk ppo``, ``torchrl_seqchunk.recipes.ppo``) with its defaults, on its default task (CartPole-v1
observing cart position and pole angle, 8 envs) unless said otherwise; one torch thread; the
sides of each ratio measured in turn in this process, so that machine load weighs on both (the
main-job runs and sb3's; the collectors, the raw env and the acting floor; the update beside
the plain compute: each group in ``--rounds`` interleaved rounds, each figure's median kept):

- ``main_job_fps_vs_sb3``: end-to-end frames/s (collection and update, from the job's start
  to its last iteration) over sb3-contrib ``RecurrentPPO`` with the rl-zoo CartPoleNoVel-v1
  settings (``bench_learning.run_sb3``) on the same frames; skipped with a message without
  the ``bench`` extra;
- ``fast_vs_serial``: the main job on its in-process vector env (``--env-batching vector``)
  over the same job on TorchRL's ``SerialEnv`` (``--env-batching serial``), every other
  option the job's default;
- ``collect_vs_env_limit``: frames/s of the job's collector (``VectorEnvCollector``) stepping
  its acting env on the vector path (its transforms and primers) with its actor and critic, over
  the same gymnasium envs in a raw ``SyncVectorEnv`` stepped with random actions (numpy, no TorchRL);
- ``acting_floor_vs_env_limit``: the same raw gymnasium envs stepped by the agent's networks
  alone on plain tensors (encoders, the native cell kernel per recurrent layer, heads, the
  critic's value, a categorical draw and its log-probability; no transform, reset of the
  memory or storage), over random actions: the most
  ``collect_vs_env_limit`` could reach with these networks in eager PyTorch; and
  ``collect_vs_acting_floor``, the job's collector over that floor;
- ``update_vs_compute_limit``: seconds of the job's update on one rollout (``update`` over
  its windows, ``epochs x minibatches`` steps) over the same steps of plain forward and
  backward of the same networks on the same batch (encoder, ``nn.GRU`` without resets,
  heads, a sum as the loss, the same clipping and Adam);
- ``vector_env_vs_serial_env`` and ``vector_env_vs_env_limit``: the envs alone, random
  actions: ``make_vector_env`` over ``SerialEnv`` of ``make_masked_env``, and over raw
  gymnasium;
- ``popgym_fast_vs_serial_<Env>``: the main job's frames/s on each POPGym task of
  ``bench_memory.py`` (``--popgym``), vector env over ``SerialEnv``, both figures printed;
- against the plain-PyTorch versions of ``plain_reference.py`` (the limit on the same kernels;
  each the median of per-round ratios, the two sides in turn): ``main_job_vs_plain_reference``
  (end-to-end frames/s over the plain job's, ``--rounds`` runs of ``--frames`` each),
  ``update_vs_plain_update`` and ``collect_vs_plain_collect`` (seconds over the plain ones', on
  the same rollout), ``dqn_step_vs_plain_dqn_step`` (seconds of ``examples/recurrent_dqn.py``'s
  gradient step over the plain one's, on the same replay chunks).

Where a frame's time goes on the fast path, microseconds per frame (``frame_us_*``), each
part the difference of two figures above: ``env`` the raw gymnasium step; ``torchrl_env``
the job's collector stepping the acting env (less its primers) with random actions (``acting_env_fps``: the
transforms' rules, partial resets, the collector's own work) less ``env``;
``acting`` the collector with the agent less that; ``update`` the job's update per frame of a
rollout; ``collection_share``: the parts but the update over all of them. The main job's
other work (advantages, batching, the report) is the rest of ``1 / main_job_fps_fast``,
measured minutes apart, so left out: on a shared machine it is within the noise.

Writes ``--out``/throughput.csv (name, value, unit, note) and ``--out``/breakdown.png (the
parts as a stacked bar, beside those of ``--before``, a throughput.csv of an earlier run).

    python benchmarks/bench_throughput.py                     # about 10 minutes on a free core
    python benchmarks/bench_throughput.py --quick             # every figure at a tiny budget
    python benchmarks/bench_throughput.py --device cuda --popgym RepeatFirstEasy
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import statistics
import time
from pathlib import Path

import torch
from bench_learning import run_ours, run_sb3  # benchmarks/bench_learning.py
from bench_memory import SUITE, env_id  # benchmarks/bench_memory.py
from plain_reference import figures as plain_figures  # benchmarks/plain_reference.py
from timing import seconds_per_call, write_figures  # benchmarks/timing.py
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.envs import SerialEnv
from tqdm import tqdm

from torchrl_seqchunk import ResetRNN
from torchrl_seqchunk.envs import DEFAULT_KEEP, make_masked_env, make_vector_env
from torchrl_seqchunk.recipes.common.agent import make_agent
from torchrl_seqchunk.recipes.common.batching import make_batching
from torchrl_seqchunk.recipes.common.config import Config
from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_collector, make_env
from torchrl_seqchunk.recipes.common.ppo import add_advantages, update

TASK = "CartPole-v1"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="device of the main job's models and collector")
    parser.add_argument("--quick", action="store_true",
                        help="every figure at a tiny budget (512 frames per job, one POPGym task)")
    parser.add_argument("--frames", type=int, default=8192, help="frames per main-job run (and sb3's)")
    parser.add_argument("--popgym", default=",".join(SUITE), help='comma-separated POPGym tasks, "" for none')
    parser.add_argument("--popgym-frames", type=int, default=2048, help="frames per POPGym run")
    parser.add_argument("--env-frames", type=int, default=8192, help="frames per env-alone and collector timing")
    parser.add_argument("--rounds", type=int, default=None,
                        help="runs of the main job on each path (and of sb3), and updates beside the plain "
                             "compute, interleaved; each side's median is kept (a busy moment of the machine "
                             "weighs on one round, not on one side); default 3, 1 with --quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_throughput", help="output folder")
    parser.add_argument("--before", default="", help="throughput.csv of an earlier run, drawn beside this one")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.before and not Path(args.before).is_file():
        parser.error(f"--before {args.before}: no such file; give the throughput.csv of an earlier run")
    if args.quick:
        args.frames, args.popgym_frames, args.env_frames = 512, 256, 1024
        if args.popgym == ",".join(SUITE):
            args.popgym = SUITE[0]
    return args


def job_fps(frames: int, seed: int, **options) -> float:
    """End-to-end frames/s of one main-job run (its first row's clock starts before the env is built)."""
    rows = run_ours(seed, frames, **options)
    return rows[-1]["frames"] / rows[-1]["wall_s"]


def sb3_fps(frames: int, seed: int) -> float:
    rows = run_sb3(seed, frames)
    return rows[-1]["frames"] / rows[-1]["wall_s"]


def random_env_fps(env, frames: int) -> float:
    """frames/s of a TorchRL batched env stepped with its action spec's random actions."""
    env.set_seed(0)
    env.rollout(8, break_when_any_done=False)  # warm-up
    steps = frames // env.batch_size[0]
    start = time.perf_counter()
    env.rollout(steps, break_when_any_done=False)
    return steps * env.batch_size[0] / (time.perf_counter() - start)


def raw_env_fps(num_envs: int, frames: int, act=None, **make_kwargs) -> float:
    """frames/s of the same gymnasium envs in a SyncVectorEnv without autoreset, the envs that
    end reset by mask: what stepping them costs without TorchRL. ``act(observation) -> actions``
    (numpy in, numpy out) chooses the actions; None: random ones."""
    raw = make_vector_env(TASK, num_envs, DEFAULT_KEEP[TASK], **make_kwargs)._env  # the gymnasium env
    obs, _ = raw.reset(seed=0)
    raw.action_space.seed(0)
    act = act or (lambda _: raw.action_space.sample())
    steps = frames // num_envs
    start = time.perf_counter()
    for _ in range(steps):
        obs, _, terminated, truncated, _ = raw.step(act(obs))
        done = terminated | truncated
        if done.any():
            obs, _ = raw.reset(options={"reset_mask": done})
    return steps * num_envs / (time.perf_counter() - start)


def network_actions(actor, critic, num_envs: int):
    """``act(observation)`` for :func:`raw_env_fps`: the agent's networks alone on plain tensors
    (encoders, one native cell kernel per recurrent layer, heads; the critic's value too, as the
    job computes it when acting), an action drawn from the actor's logits with its
    log-probability; no transform, no reset of the memory, nothing stored. What acting
    costs at the least with these networks in eager PyTorch (a discrete actor)."""
    networks = [plain_modules(actor), plain_modules(critic)]
    for module in (m for modules in networks for m in modules if isinstance(m, nn.RNNBase)):
        if getattr(module, "proj_size", 0) or module.bidirectional or not isinstance(module, (nn.GRU, nn.LSTM)):
            raise ValueError(f"the acting floor steps nn.GRU / nn.LSTM layers with their native cells, got {module} "
                             "(a projection, two directions or another RNN have no cell kernel of their own).")
    weight = next(actor.parameters())
    states = [[_zero_state(m, num_envs, weight) for m in modules] for modules in networks]

    @torch.no_grad()
    def act(obs):
        x = torch.from_numpy(obs).to(weight)
        outputs = []
        for modules, held in zip(networks, states):
            y = x
            for index, module in enumerate(modules):
                if isinstance(module, nn.RNNBase):
                    y, held[index] = _cell_steps(module, y, held[index])
                else:
                    y = module(y)
            outputs.append(y)
        logits = outputs[0].flatten(1)
        log_p = logits - logits.logsumexp(-1, keepdim=True)
        action = torch.multinomial(log_p.exp(), 1)
        log_p.gather(-1, action)
        return action.view(-1).cpu().numpy()

    return act


def _zero_state(module: nn.Module, rows: int, like: torch.Tensor):
    if not isinstance(module, nn.RNNBase):
        return None
    h = like.new_zeros(module.num_layers, rows, module.hidden_size)
    return (h, h.clone()) if isinstance(module, nn.LSTM) else h


def _cell_steps(rnn: nn.RNNBase, x: torch.Tensor, state):
    """One step of every layer of an ``nn.GRU`` / ``nn.LSTM`` with its native cell kernel."""
    new = []
    for layer in range(rnn.num_layers):
        weights = [getattr(rnn, f"{name}_l{layer}", None) for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        if isinstance(rnn, nn.LSTM):
            h, c = torch.lstm_cell(x, (state[0][layer], state[1][layer]), *weights)
            new.append((h, c))
        else:
            h = torch.gru_cell(x, state[layer], *weights)
            new.append(h)
        x = h
    if isinstance(rnn, nn.LSTM):
        return x, (torch.stack([h for h, _ in new]), torch.stack([c for _, c in new]))
    return x, torch.stack(new)


def plain_modules(module) -> list[nn.Module]:
    """The nn.Modules a TensorDict network calls, in order; a ResetRNN as its nn.GRU / nn.LSTM;
    a distribution module (no parameters) left out."""
    if isinstance(module, ResetRNN):
        return [module.rnn]
    if isinstance(module, TensorDictSequential):
        return [m for child in module.module for m in plain_modules(child)]
    inner = getattr(module, "module", None)
    if inner is None:
        return []
    return plain_modules(inner) if isinstance(inner, TensorDictModuleBase) else [inner]


def plain_step(networks, batch, params, optim, max_grad_norm: float) -> None:
    """Forward and backward of the networks on the batch's observations, no resets, no TensorDict."""
    loss = 0.0
    for modules in networks:
        x = batch["observation"]
        for module in modules:
            x = module(x)[0] if isinstance(module, nn.RNNBase) else module(x)
        loss = loss + x.float().sum()
    optim.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(params, max_grad_norm)
    optim.step()


def collector_rounds(cfg, env, policy, frames: int):
    """The job's collector (``make_collector``: VectorEnvCollector on the vector env) after one
    warm-up rollout: ``(collector, timed, kept)``, ``timed()`` the frames/s of the next
    ``frames`` (whole rollouts) and ``kept`` the rollouts of its last call."""
    per_batch = cfg.num_envs * cfg.rollout_len
    collector = make_collector(cfg, env, policy, per_batch, -1)
    batches = iter(collector)
    next(batches)  # warm-up
    kept = []

    def timed() -> float:
        start = time.perf_counter()
        kept[:] = [next(batches) for _ in range(max(1, frames // per_batch))]
        return sum(r.numel() for r in kept) / (time.perf_counter() - start)

    return collector, timed, kept


def random_actions(env) -> TensorDictModule:
    """A policy drawing uniform actions from the env's action spec (any collector runs it)."""
    spec = env.full_action_spec["action"]
    return TensorDictModule(lambda observation: spec.rand(), in_keys=["observation"], out_keys=["action"])


def collect_and_update(cfg, frames: int, rounds: int) -> dict[str, float]:
    """The collector's frames/s with random actions and with the agent, the raw env's, the
    acting floor's (:func:`network_actions`), and the update's seconds beside the plain
    compute: the medians of ``rounds`` interleaved calls of each."""
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    actor, critic = actor.to(cfg.device), critic.to(cfg.device)
    env = make_env(cfg)  # the acting env less the agent's primers (random actions keep no memory)
    env.set_seed(cfg.seed)
    collectors, timers = [], {}
    for name, acting_env, policy in [("acting_env_fps", env, random_actions(env)),
                                     ("collect_fps", make_acting_env(cfg, rnns, cfg.seed),
                                      TensorDictSequential(actor, critic))]:
        collector, timers[name], rollouts = collector_rounds(cfg, acting_env, policy, frames)
        collectors.append(collector)
    timers["env_fps_raw"] = lambda: raw_env_fps(cfg.num_envs, frames)
    timers["acting_floor_fps"] = lambda: raw_env_fps(cfg.num_envs, frames, network_actions(actor, critic, cfg.num_envs))
    fps = {name: [] for name in timers}
    for _ in range(rounds):  # interleaved: each round's figures under the same load
        for name, timed in timers.items():
            fps[name].append(timed())
    for collector in collectors:
        collector.shutdown()
    torch.set_num_threads(1)  # TorchRL's batched env raises the thread count when it closes

    batching = make_batching(cfg, rnns, cfg.num_envs * cfg.rollout_len)
    steps = batching.batches(add_advantages(cfg, critic, rollouts[-1]))
    loss = batching.make_loss(actor, critic)
    optim = torch.optim.Adam(loss.parameters(), lr=cfg.lr, eps=1e-5)
    networks, params = [plain_modules(actor), plain_modules(critic)], list(loss.parameters())

    def job_update(batches):
        update(loss, optim, batches, weight=batching.weight, max_grad_norm=cfg.max_grad_norm)

    def plain_update(batches):
        for batch in batches:
            plain_step(networks, batch, params, optim, cfg.max_grad_norm)

    job_update(steps[:2]), plain_update(steps[:2])  # warm-up
    seconds = {"update_s": [], "compute_s": []}
    for _ in range(rounds):  # one call of each is at the mercy of one busy moment
        seconds["update_s"].append(seconds_per_call(lambda: job_update(steps)))
        seconds["compute_s"].append(seconds_per_call(lambda: plain_update(steps)))
    return {"steps": len(steps), **{name: statistics.median(values) for name, values in {**fps, **seconds}.items()}}


PARTS = ("env", "torchrl_env", "acting", "update")


def breakdown(figures: dict[str, float], rollout_frames: int) -> dict[str, float]:
    """Microseconds per frame of each part (see the module docstring) from this run's figures."""
    per_frame = {name: 1e6 / figures[name] for name in ("env_fps_raw", "acting_env_fps", "collect_fps")}
    return {"env": per_frame["env_fps_raw"],
            "torchrl_env": per_frame["acting_env_fps"] - per_frame["env_fps_raw"],
            "acting": per_frame["collect_fps"] - per_frame["acting_env_fps"],
            "update": 1e6 * figures["update_s"] / rollout_frames}


def plot_breakdown(bars: dict[str, dict[str, float]], path: Path) -> None:
    """One stacked horizontal bar per run: each part's share of the frame's time, the total
    in microseconds beside it (runs apart on a shared machine compare by share)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.5 * len(bars)))
    for row, parts in enumerate(bars.values()):
        widths = {name: max(0.0, parts[name]) for name in PARTS}  # a part within the noise may come out below 0
        total, left = sum(widths.values()), 0.0
        for index, name in enumerate(PARTS):
            share = 100 * widths[name] / total
            ax.barh(row, share, left=left, color=f"C{index}", label=name if row == 0 else None)
            if share > 6:
                ax.text(left + share / 2, row, f"{share:.0f}%", ha="center", va="center", fontsize=8)
            left += share
        ax.text(101, row, f"{total:,.0f} us", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), list(bars))
    ax.set_xlim(0, 115)
    ax.set_xlabel("share of a frame's time, % (vector path, 8 envs, one thread)")
    ax.set_title("Where a frame's time goes")
    ax.legend(ncol=len(PARTS), fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.12))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rows, ratios = [], {}

    def record(name: str, value: float, unit: str, note: str = "") -> float:
        rows.append({"name": name, "value": value, "unit": unit, "note": note})
        if unit == "ratio":
            ratios[name] = value
        return value

    # the fast path named: the job's default env batching may be either
    cfg = Config(device=args.device, seed=args.seed, progress=False, env_batching="vector")
    has_sb3 = importlib.util.find_spec("sb3_contrib") is not None
    popgym = [name for name in args.popgym.split(",") if name]
    bar = tqdm(total=5 + 2 * len(popgym), desc="bench_throughput")

    n, keep = cfg.num_envs, DEFAULT_KEEP[TASK]
    env_fps = {"vector": random_env_fps(make_vector_env(TASK, n, keep), args.env_frames),
               "serial": random_env_fps(SerialEnv(n, lambda: make_masked_env(TASK, keep)), args.env_frames)}
    for side, fps in env_fps.items():
        record(f"env_fps_{side}", fps, "frames/s", f"{n} envs of {TASK} {keep}, random actions")
    record("vector_env_vs_serial_env", env_fps["vector"] / env_fps["serial"], "ratio")
    bar.update()

    measured = collect_and_update(cfg, args.env_frames, args.rounds)
    rounds = f"median of {args.rounds} interleaved rounds"
    raw = record("env_fps_raw", measured["env_fps_raw"], "frames/s",
                 f"{n} envs of {TASK} {keep} in raw gymnasium, random actions, {rounds}")
    record("vector_env_vs_env_limit", env_fps["vector"] / raw, "ratio")
    record("acting_env_fps", measured["acting_env_fps"], "frames/s",
           f"the job's collector and acting env, random actions, {rounds}")
    record("collect_fps", measured["collect_fps"], "frames/s", f"the job's collector, acting env and policy, {rounds}")
    record("acting_floor_fps", measured["acting_floor_fps"], "frames/s",
           f"raw gymnasium stepped by the agent's networks alone on plain tensors, {rounds}")
    record("collect_vs_env_limit", measured["collect_fps"] / raw, "ratio")
    record("acting_floor_vs_env_limit", measured["acting_floor_fps"] / raw, "ratio")
    record("collect_vs_acting_floor", measured["collect_fps"] / measured["acting_floor_fps"], "ratio")
    record("update_s", measured["update_s"], "s", f"{measured['steps']} gradient steps on one rollout")
    record("compute_s", measured["compute_s"], "s", "plain forward and backward, same networks and batches")
    record("update_vs_compute_limit", measured["update_s"] / measured["compute_s"], "ratio")
    bar.update()

    runs = {"vector": [], "serial": [], "sb3": []}
    for _ in range(args.rounds):  # interleaved: each round's runs under the same load
        for path in ("vector", "serial"):
            runs[path].append(job_fps(args.frames, args.seed, device=args.device, env_batching=path))
        if has_sb3:
            runs["sb3"].append(sb3_fps(args.frames, args.seed))
    fast = record("main_job_fps_fast", statistics.median(runs["vector"]), "frames/s",
                  f"{args.frames} frames, --env-batching vector, {rounds}")
    serial = record("main_job_fps_serial", statistics.median(runs["serial"]), "frames/s",
                    f"--env-batching serial, {rounds}")
    record("fast_vs_serial", fast / serial, "ratio")
    bar.update()
    if has_sb3:
        theirs = record("sb3_fps", statistics.median(runs["sb3"]), "frames/s", f"RecurrentPPO, rl-zoo settings, {rounds}")
        record("main_job_fps_vs_sb3", fast / theirs, "ratio")
    else:
        print("main_job_fps_vs_sb3 skipped: sb3_contrib is missing (pip install -e '.[bench]')")
    bar.update()

    for name, value, unit, note in plain_figures(frames=args.frames, rounds=args.rounds, seed=args.seed):
        record(name, value, unit, note)
    bar.update()

    for name in popgym:
        fps = {}
        for path in ("vector", "serial"):
            fps[path] = record(f"popgym_fps_{path}_{name}", job_fps(
                args.popgym_frames, args.seed, env=env_id(name), keep="all", device=args.device,
                env_batching=path), "frames/s", f"{args.popgym_frames} frames")
            bar.update()
        record(f"popgym_fast_vs_serial_{name}", fps["vector"] / fps["serial"], "ratio")
    bar.close()

    figures = {row["name"]: row["value"] for row in rows}
    parts = breakdown(figures, cfg.num_envs * cfg.rollout_len)
    for name, value in parts.items():
        record(f"frame_us_{name}", value, "us/frame", "where a frame's time goes (see the module docstring)")
    record("collection_share", 1 - parts["update"] / sum(parts.values()), "ratio")
    bars = {"this run": parts}
    if args.before:
        with open(args.before) as f:
            before = {row["name"]: float(row["value"]) for row in csv.DictReader(f)}
        bars = {"before": {name: before[f"frame_us_{name}"] for name in PARTS}, "after": parts}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    plot_breakdown(bars, Path(args.out) / "breakdown.png")

    for row in rows:
        if row["unit"] != "ratio":
            print(f"{row['name']:>36}: {row['value']:10.2f} {row['unit']}  {row['note']}")
    write_figures(rows, ratios, Path(args.out) / "throughput.csv")
    return ratios


if __name__ == "__main__":
    main()
