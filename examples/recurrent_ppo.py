"""Recurrent PPO on a partially observable task, composed from TorchRL and torchrl_seqchunk.

Default task: CartPole-v1 without its velocity components (the agent sees cart position
and pole angle only), so it must infer velocities from memory.

    python examples/recurrent_ppo.py                               # windows, reset_continue
    python examples/recurrent_ppo.py --boundary-mode mask          # the usual masked baseline
    python examples/recurrent_ppo.py --batching streams            # stream chunks + carry
    python examples/recurrent_ppo.py --env Pendulum-v1 --keep 0,1  # any gymnasium id ("module:Id" too)

Pipeline per iteration:
  1. a TorchRL Collector steps `num_envs` envs (observations normalized by VecNormV2,
     rewards scaled by ReturnScaledReward); the actor and critic run ResetRNN in step
     mode, so the rollout stores the memory each of them had at every step;
  2. boundary_gae computes advantages on the rollout [num_envs, T];
  3. `--batching windows`: make_windows cuts windows [N, W] and RecurrentPPOLoss unrolls
     them with `--boundary-mode`; `--batching streams`: the rollout goes into a storage,
     StreamChunkSampler(replacement=False) + ChunkPrefetcher deliver chunks [B, L] and the
     ResetRNN modules carry their state from one chunk to the next (truncated BPTT).
Writes runs/<name>/metrics.csv and runs/<name>/learning_curve.png.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import itertools
import re
import time
import warnings
from collections import deque
from pathlib import Path

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import (
    Compose,
    InitTracker,
    ParallelEnv,
    RewardSum,
    SerialEnv,
    TransformedEnv,
    VecNormV2,
)
from torchrl.modules import (
    MLP,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.modules.distributions import NormalParamExtractor
from torchrl.objectives import ClipPPOLoss
from tqdm import tqdm

from torchrl_seqchunk import (
    ChunkPrefetcher,
    RecurrentPPOLoss,
    ResetRNN,
    ReturnScaledReward,
    StreamChunkSampler,
    boundary_gae,
    make_windows,
)
from torchrl_seqchunk.envs import DEFAULT_KEEP, make_masked_env, make_vector_env

from cli import config_parser, opt  # examples/cli.py


@dataclasses.dataclass
class Config:
    env: str = opt("CartPole-v1", 'gymnasium id, "module:Id" too (e.g. popgym:popgym-RepeatFirstEasy-v0)')
    keep: str = opt("auto", 'observation indices kept: "0,2", "all", or "auto" (envs.DEFAULT_KEEP)')
    max_episode_steps: int = opt(0, "truncate episodes after this many steps (gymnasium's TimeLimit); 0 keeps the env's own limit")
    total_frames: int = opt(100_000, "env frames of the run; also the length of the lr and clip schedules")
    seed: int = opt(0, "seed of torch, the envs and the sampler")
    device: str = opt("cpu", "torch device of the models and the collector")
    threads: int = opt(1, "torch intra-op threads; small models run fastest on one")
    num_envs: int = opt(8, "envs stepped by the collector")
    env_batching: str = opt("vector", "how the envs are stepped: vector (one in-process gymnasium vector env, "
                                      "fastest for cheap envs), serial (TorchRL SerialEnv), parallel (ParallelEnv workers)")
    name: str = opt("", 'run directory name under --runs-dir; "" derives it from the options')
    runs_dir: str = opt("runs", "folder of the run directories")
    overwrite: bool = opt(False, "replace the outputs of a finished run of the same name")
    # collection
    rollout_len: int = opt(32, "T: steps per env per iteration; frames per iteration = num_envs * T")
    obs_norm: bool = opt(True, "normalize observations by their running mean and std (TorchRL's VecNormV2)")
    reward_norm: bool = opt(True, "divide rewards by the running std of the discounted return (ReturnScaledReward)")
    # model
    hidden: int = opt(64, "units of the encoder, the recurrent layer and the heads")
    cell: str = opt("gru", "recurrent layer of the actor and of the critic")
    encoder: bool = opt(True, "a Linear+Tanh layer before the recurrent layer")
    activation: str = opt("tanh", "activation of the heads")
    # PPO
    gamma: float = opt(0.98, "discount")
    lmbda: float = opt(0.8, "GAE lambda")
    lr: float = opt(1e-3, "Adam learning rate")
    anneal_lr: bool = opt(True, "decay the learning rate linearly to 0 over total_frames")
    anneal_clip: bool = opt(True, "decay clip_epsilon linearly to 0 over total_frames")
    epochs: int = opt(10, "passes over each rollout")
    minibatches: int = opt(1, "gradient steps per epoch (windows mode)")
    clip_epsilon: float = opt(0.2, "PPO clip range")
    entropy_coeff: float = opt(0.0, "entropy bonus weight")
    critic_coeff: float = opt(0.5, "value loss weight")
    max_grad_norm: float = opt(0.5, "global gradient norm clip")
    # batching
    batching: str = opt("windows", "windows of each rollout, or stream chunks with a carried state")
    boundary_mode: str = opt("reset_continue", "windows only: what RecurrentPPOLoss does at episode starts")
    window: int = opt(32, "W, steps per window (= rollout_len: every step is unrolled once per epoch)")
    stride: int = opt(32, "steps between window starts")
    num_streams: int = opt(8, "streams only: B, streams per chunk")
    chunk_len: int = opt(32, "streams only: L, steps per chunk")
    # reporting
    return_window: int = opt(20, "episodes averaged in the reported mean return")
    target_return: str = opt("auto", 'mean return whose first frame is reported; "auto": 450 on CartPole-v1, none elsewhere')
    stop_at_target: bool = opt(False, "end the run once the mean return reaches the target")
    progress: bool = opt(True, "show a progress bar")

    @property
    def target(self) -> float | None:
        """The target mean return, or None."""
        if self.target_return == "auto":
            return 450.0 if self.env == "CartPole-v1" else None
        return float(self.target_return)


CHOICES = {"batching": ("windows", "streams"), "boundary_mode": ("reset_continue", "mask", "inverse_count"),
           "cell": ("gru", "lstm"), "activation": ("tanh", "relu"), "env_batching": ("vector", "serial", "parallel")}
LOGGED = ("loss_objective", "loss_critic", "entropy", "clip_fraction", "kl_approx")


def parse_args(argv=None) -> Config:
    parser = config_parser(Config, __doc__, CHOICES)
    cfg = Config(**vars(parser.parse_args(argv)))
    if cfg.batching == "streams" and cfg.boundary_mode != "reset_continue":
        parser.error("--boundary-mode applies to --batching windows only; stream chunks carry the state")
    if cfg.target_return != "auto":
        try:
            cfg.target
        except ValueError:
            parser.error(f"--target-return must be a number or 'auto', got {cfg.target_return!r}")
    if cfg.max_episode_steps < 0:
        parser.error(f"--max-episode-steps must be >= 0 (0: the env's own limit), got {cfg.max_episode_steps}")
    if not cfg.name:
        mode = cfg.boundary_mode if cfg.batching == "windows" else "streams"
        cfg.name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cfg.env)}_{mode}_seed{cfg.seed}"
    return cfg


def make_env(cfg: Config, *, warn: bool = False) -> TransformedEnv:
    """The batched, transformed env of the run; ``warn``: say once per run if --keep auto knows no mask."""
    if cfg.keep in ("auto", "all"):
        keep = DEFAULT_KEEP.get(cfg.env) if cfg.keep == "auto" else None
        if warn and cfg.keep == "auto" and keep is None:
            warnings.warn(f"--keep auto: no known mask for {cfg.env}, so the agent sees the env's whole "
                          "observation (right for tasks that are partially observable already, such as "
                          "POPGym's); pass --keep with the indices to keep to hide the rest.", stacklevel=2)
    else:
        keep = tuple(int(i) for i in cfg.keep.split(","))  # e.g. "0,2"
    limit = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    if cfg.env_batching == "vector":  # the same episodes as serial for the same seed, several times faster
        batched = make_vector_env(cfg.env, cfg.num_envs, keep, **limit)
    else:
        factory = functools.partial(make_masked_env, cfg.env, keep, **limit)  # picklable for workers
        batched = {"serial": SerialEnv, "parallel": ParallelEnv}[cfg.env_batching](cfg.num_envs, factory)
    # is_first: True on the first step of every episode, what ResetRNN resets on.
    transforms = [InitTracker(init_key="is_first"), RewardSum()]  # RewardSum: the raw return
    if cfg.obs_norm:  # one set of statistics over all envs (TorchRL calls a batched env experimental)
        warnings.filterwarnings("ignore", "Support of VecNormV2 for containers with non-empty batch-size")
        transforms.append(VecNormV2(in_keys=["observation"], decay=1.0, reduce_batch_dims=True))
    if cfg.reward_norm:
        transforms.append(ReturnScaledReward(gamma=cfg.gamma))
    return TransformedEnv(batched, Compose(*transforms))


def make_acting_env(cfg: Config, rnns, seed: int) -> TransformedEnv:
    """make_env's env with the primers of the agent's ResetRNNs, seeded: what a collector steps.

    The primers declare each ResetRNN's memory in the env specs: zeros at reset, carried
    from ("next", state) to the root by the collector. A module-level function, so
    functools.partial(make_acting_env, cfg, rnns, seed) is a picklable env factory for
    workers in other processes (Ray actors)."""
    env = make_env(cfg)
    env.append_transform(Compose(*[rnn.make_tensordict_primer() for rnn in rnns]))
    env.set_seed(seed)
    return env


class IndependentOneHotCategorical(torch.distributions.Independent):
    """k independent one-hot categoricals, logits ``[*, k, n]``; log-probs summed over k."""

    def __init__(self, logits: torch.Tensor):
        super().__init__(OneHotCategorical(logits=logits), 1)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        """The most likely one-hot of each categorical, ``[*, k, n]``: what TorchRL draws in
        its deterministic interaction mode (as its own ``OneHotCategorical`` does)."""
        return self.mode


def make_agent(cfg: Config, env: TransformedEnv):
    """Actor and critic, each an MLP encoder -> ResetRNN(GRU) -> head."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["action"]
    discrete = action_spec.domain == "discrete"
    streams = cfg.batching == "streams"

    activation = {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.activation]

    def trunk(prefix: str) -> tuple[TensorDictSequential, ResetRNN]:
        in_size = cfg.hidden if cfg.encoder else obs_dim
        rnn = ResetRNN(
            {"gru": nn.GRU, "lstm": nn.LSTM}[cfg.cell](in_size, cfg.hidden, batch_first=True),
            in_key=f"{prefix}_embed",
            out_key=f"{prefix}_features",
            state_key=f"{prefix}_state",
            # at a reset slot inside a training sequence, use the memory stored when acting
            reset_state_key=f"{prefix}_state",
            carry=streams,  # streams: chunk k+1 continues from chunk k's final state
        )
        encoder = TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, cfg.hidden), nn.Tanh()) if cfg.encoder else nn.Identity(),
            in_keys=["observation"], out_keys=[f"{prefix}_embed"],
        )
        return TensorDictSequential(encoder, rnn), rnn

    actor_trunk, actor_rnn = trunk("actor")
    critic_trunk, critic_rnn = trunk("critic")
    if discrete:  # one-hot [n], or [k, n] for a gymnasium MultiDiscrete action (k choices of n)
        head = TensorDictModule(
            nn.Sequential(MLP(in_features=cfg.hidden, out_features=action_spec.shape.numel(),
                              num_cells=[cfg.hidden], activation_class=activation),
                          nn.Unflatten(-1, action_spec.shape)),
            in_keys=["actor_features"], out_keys=["logits"])
        dist_class = OneHotCategorical if len(action_spec.shape) == 1 else IndependentOneHotCategorical
        dist_keys, dist_kwargs = ["logits"], {}
    else:
        head = TensorDictModule(
            nn.Sequential(MLP(in_features=cfg.hidden, out_features=2 * action_spec.shape[-1],
                              num_cells=[cfg.hidden], activation_class=activation), NormalParamExtractor()),
            in_keys=["actor_features"], out_keys=["loc", "scale"])
        dist_keys, dist_class = ["loc", "scale"], TanhNormal
        dist_kwargs = {"low": action_spec.space.low, "high": action_spec.space.high}
    actor = ProbabilisticActor(
        TensorDictSequential(actor_trunk, head), in_keys=dist_keys, spec=action_spec,
        distribution_class=dist_class, distribution_kwargs=dist_kwargs, return_log_prob=True,
    )
    critic = TensorDictSequential(
        critic_trunk,
        ValueOperator(MLP(in_features=cfg.hidden, out_features=1, num_cells=[cfg.hidden],
                          activation_class=activation),
                      in_keys=["critic_features"]),
    )
    return actor, critic, (actor_rnn, critic_rnn)


def plot_curve(rows: list[dict], path: Path, cfg: Config) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r["frames"], r["return_mean"]) for r in rows if r["return_mean"] == r["return_mean"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        ax.plot(*zip(*points))
    if cfg.target is not None:  # the target line belongs to the task it was set for
        ax.axhline(cfg.target, color="gray", ls="--", lw=1, label=f"target {cfg.target:g}")
        ax.legend(loc="upper left")
    ax.set(xlabel="frames", ylabel=f"mean return, last {cfg.return_window} episodes", title=cfg.name)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def make_loss(cfg: Config, actor, critic) -> ClipPPOLoss:
    """RecurrentPPOLoss over windows; TorchRL's ClipPPOLoss over stream chunks."""
    ppo_options = dict(clip_epsilon=cfg.clip_epsilon, entropy_coeff=cfg.entropy_coeff,
                       critic_coeff=cfg.critic_coeff, loss_critic_type="l2", normalize_advantage=True)
    if cfg.batching == "windows":
        return RecurrentPPOLoss(actor, critic, boundary_mode=cfg.boundary_mode, **ppo_options)
    # Chunks continue each other, so the ResetRNNs carry their state and TorchRL's loss
    # is enough; padded slots (("collector", "mask") False) are left out of its means,
    # but not out of its advantage statistics: advantages are standardized per rollout.
    return ClipPPOLoss(actor, critic, **{**ppo_options, "normalize_advantage": False})


def make_stream_buffer(cfg: Config, capacity: int, generator: torch.Generator) -> TensorDictReplayBuffer:
    """A storage of rollout steps read as B balanced streams: each episode piece once per epoch."""
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity, device=cfg.device),
        sampler=StreamChunkSampler(cfg.num_streams, cfg.chunk_len, replacement=False,
                                   traj_key=("collector", "traj_ids"), only_complete=False,
                                   generator=generator),
        batch_size=cfg.num_streams * cfg.chunk_len,
    )


def next_values(critic, rollout: TensorDictBase) -> torch.Tensor:
    """V(next observation) under the memory held after each step, [num_envs, T, 1].

    Where the episode goes on, that is the next step's own value, computed when acting;
    the critic runs (step mode) only on the next observations of the steps that end an
    episode (a truncation bootstraps from it) and of each row's last step."""
    values = rollout["state_value"].roll(-1, dims=-2)  # V(s_{t+1}); the last column is replaced
    ends = rollout["next", "done"].squeeze(-1).clone()  # [num_envs, T]
    ends[..., -1] = True
    with torch.no_grad():
        values[ends] = critic(rollout["next"][ends])["state_value"]
    return values


def add_advantages(cfg: Config, critic, rollout: TensorDictBase) -> TensorDictBase:
    """Writes "advantage" and "value_target" into a rollout [num_envs, T] (standardized
    advantages for stream chunks) and returns it."""
    rollout["next", "state_value"] = next_values(critic, rollout)
    boundary_gae(rollout, gamma=cfg.gamma, lmbda=cfg.lmbda)  # advantage, value_target
    if cfg.batching == "streams":
        advantage = rollout["advantage"]
        rollout["advantage"] = (advantage - advantage.mean()) / advantage.std().clamp_min(1e-8)
    return rollout


def update(cfg: Config, loss_module, optim: torch.optim.Optimizer, batches) -> TensorDictBase:
    """One PPO gradient step per batch; returns the mean of the logged losses."""
    logs = []
    for batch in batches:
        loss = loss_module(batch)
        total = loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]
        if cfg.batching == "streams":  # a chunk weighs what its real (unpadded) slots do
            total = total * batch["collector", "mask"].float().mean()
        optim.zero_grad()
        total.backward()
        nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
        optim.step()
        logs.append(loss.detach().select(*LOGGED))
    return torch.stack(logs).mean()


def anneal(cfg: Config, optim: torch.optim.Optimizer, loss_module, remaining: float) -> None:
    """Linear schedules, 1 -> 0 as `remaining` goes from 1 to 0."""
    if cfg.anneal_lr:
        for group in optim.param_groups:
            group["lr"] = cfg.lr * remaining
    if cfg.anneal_clip:
        loss_module.clip_epsilon.fill_(cfg.clip_epsilon * remaining)


def finished_returns(steps: TensorDictBase) -> list[float]:
    """The raw returns of the episodes that end in `steps` (any batch shape)."""
    done = steps["next", "done"].squeeze(-1)
    return steps["next", "episode_reward"][done].squeeze(-1).tolist()


def run_dir(cfg: Config) -> Path:
    """runs/<name>; exits when it holds a finished run and --overwrite is not given."""
    out_dir = Path(cfg.runs_dir) / cfg.name
    if (out_dir / "metrics.csv").exists() and not cfg.overwrite:
        raise SystemExit(f"{out_dir} holds the outputs of an earlier run; pass --name to write "
                         "elsewhere or --overwrite to replace them.")
    return out_dir


class Report:
    """One row per iteration in runs/<name>/metrics.csv, a progress bar, the frames to the
    target, and at the end the learning curve and a summary line."""

    def __init__(self, cfg: Config, planned_frames: int):
        self.cfg, self.out_dir = cfg, run_dir(cfg)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.returns: deque[float] = deque(maxlen=cfg.return_window)
        self.rows, self.frames, self.episodes, self.frames_to_target = [], 0, 0, None
        self.start = time.perf_counter()
        self.bar = tqdm(total=planned_frames, unit="frames", disable=not cfg.progress)
        self.file = open(self.out_dir / "metrics.csv", "w", newline="")
        self.writer = None

    @property
    def reached(self) -> bool:
        """The run should stop: --stop-at-target and the target was reached."""
        return self.cfg.stop_at_target and self.frames_to_target is not None

    def add(self, frames: int, returns: list[float], losses: TensorDictBase) -> dict:
        cfg = self.cfg
        self.frames += frames
        self.returns.extend(returns)
        self.episodes += len(returns)
        return_mean = sum(self.returns) / len(self.returns) if self.returns else float("nan")
        if (self.frames_to_target is None and len(self.returns) == self.returns.maxlen
                and cfg.target is not None and return_mean >= cfg.target):
            self.frames_to_target = self.frames
        row = {"frames": self.frames, "wall_s": round(time.perf_counter() - self.start, 2),
               "episodes": self.episodes, "return_mean": return_mean,
               **{k: losses[k].item() for k in LOGGED}}
        self.rows.append(row)
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row))
            self.writer.writeheader()
        self.writer.writerow(row)
        self.file.flush()
        self.bar.set_postfix(ret=f"{return_mean:.1f}", loss=f"{row['loss_objective']:.3f}", refresh=False)
        self.bar.update(frames)  # one refresh per iteration
        return row

    def close(self) -> None:
        cfg, rows = self.cfg, self.rows
        self.bar.close()
        self.file.close()
        plot_curve(rows, self.out_dir / "learning_curve.png", cfg)
        seen = [r["return_mean"] for r in rows if r["return_mean"] == r["return_mean"]]  # skip NaN
        reached = "not reached" if self.frames_to_target is None else self.frames_to_target
        target = f"frames_to_{cfg.target:g}: {reached} " if cfg.target is not None else ""
        print(f"{target}best_return: {max(seen, default=float('nan')):.1f} "
              f"final_return: {rows[-1]['return_mean']:.1f} wall_s: {rows[-1]['wall_s']} -> {self.out_dir}")


def main(cfg: Config) -> list[dict]:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    planned_frames = -(-cfg.total_frames // frames_per_batch) * frames_per_batch  # whole rollouts
    report = Report(cfg, planned_frames)

    actor, critic, rnns = make_agent(cfg, make_env(cfg, warn=True))  # shaped by the env's specs
    env = make_acting_env(cfg, rnns, cfg.seed)
    actor, critic = actor.to(cfg.device), critic.to(cfg.device)

    collector = Collector(
        env, TensorDictSequential(actor, critic),  # the critic also runs, storing its memory
        frames_per_batch=frames_per_batch, total_frames=planned_frames, device=cfg.device,
        auto_register_policy_transforms=False,  # InitTracker(init_key="is_first") is there
    )
    memory_keys = [k for rnn in rnns for k in rnn.state_keys]
    loss_module = make_loss(cfg, actor, critic)
    if cfg.batching == "streams":
        buffer = make_stream_buffer(cfg, frames_per_batch, torch.Generator().manual_seed(cfg.seed))
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)

    for rollout in collector:  # [num_envs, T]
        # TorchRL's batched env raises the thread count when it closes, before the last batch
        torch.set_num_threads(cfg.threads)
        returns = finished_returns(rollout)
        add_advantages(cfg, critic, rollout)
        if cfg.batching == "windows":
            windows = make_windows(rollout, cfg.window, stride=cfg.stride, memory_key=memory_keys)  # [N, W]
            losses = update(cfg, loss_module, optim, [windows[idx] for _ in range(cfg.epochs)
                                                      for idx in torch.randperm(windows.shape[0]).chunk(cfg.minibatches)])
        else:
            buffer.empty()
            buffer.extend(rollout.reshape(-1))  # [num_envs * T] steps, env after env
            # iterating the buffer is one epoch of [B, L] chunks; the prefetcher keeps their order
            epochs = itertools.chain.from_iterable(itertools.repeat(buffer, cfg.epochs))
            with ChunkPrefetcher(epochs, device=cfg.device) as chunks:
                losses = update(cfg, loss_module, optim, chunks)
        collector.update_policy_weights_()
        anneal(cfg, optim, loss_module, max(0.0, 1 - (report.frames + rollout.numel()) / planned_frames))
        report.add(rollout.numel(), returns, losses)
        if report.reached:
            break
    collector.shutdown()
    report.close()
    return report.rows


if __name__ == "__main__":
    main(parse_args())
