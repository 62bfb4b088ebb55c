"""Recurrent soft actor-critic on a partially observable continuous task, from TorchRL and torchrl_seqchunk.

Default task: Pendulum-v1 observing cos and sin of the angle only ("Pendulum-P", --keep 0,1):
the angular velocity must come from memory. `--net` and `--replay` choose the recipe,
everything else equal (frames, gradient steps, learned steps per gradient step):

    seqchunk sac                         # streams: [B, T] chunks, each network's carry
    seqchunk sac --replay sequence       # TorchRL's Sequence, stored state + burn-in (R2D2)
    seqchunk sac --replay slice          # TorchRL's SliceSampler, stored state
    seqchunk sac --net ff                # TorchRL's SACLoss, an MLP on the partial observation
    seqchunk sac --net framestack        # TorchRL's SACLoss on CatFrames' last 4 observations
    seqchunk sac --keep 2                # Pendulum-V: the angular velocity only
    seqchunk sac --keep 2 --prev-reward  # ... and the previous reward (pomdp-baselines' inputs)

Pipeline per collector batch:
  1. the collector steps `num_envs` envs with the stochastic actor (ResetRNN in step mode: the
     buffer stores the actor's memory, and for sequence / slice the critic's, at every step);
  2. the steps go into a TensorDictReplayBuffer: flat for StreamChunkSampler(B, T) (and for the
     feed-forward recipes' uniform transitions), [time, env] for Sequence and SliceSampler;
  3. `replay_ratio * frames / (B * T)` gradient steps of RecurrentSACLoss (TorchRL's SACLoss for
     ff / framestack: B * T transitions per step), SoftUpdate of the target critic;
  4. every `--eval-every` frames, `--eval-episodes` episodes with deterministic actions.
Writes runs/<name>/metrics.csv (eval_return: the last evaluation's mean return) and learning_curve.png.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import time
from typing import ClassVar, Literal

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule as Mod, TensorDictSequential as Seq
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer, Unbounded
from torchrl.data.replay_buffers.sample_units import Sequence
from torchrl.envs import CatFrames, ExplorationType, TensorDictPrimer, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, set_recurrent_mode
from torchrl.objectives import SACLoss, SoftUpdate

from torchrl_seqchunk import RecurrentSACLoss, ResetRNN, StreamChunkSampler

from .common import envs, options, report
from .common.config import RunConfig, env_name
from .common.report import Run
from .common.windows import mark_outside

PREV = "prev_action"  # float [*, A]: the action of the step before (zeros at is_init), --prev-action
LEARN = "learn"  # bool [B, L]: the steps of a window that count in the loss
STEP_KEYS = ["observation", "action", "is_init", ("collector", "traj_ids"), PREV,
             *(("next", key) for key in ("observation", "reward", "done", "terminated", "truncated", PREV))]
STORED = ["actor_state", "critic_state"]  # the memories sequence / slice windows start from


@dataclasses.dataclass
class Config(RunConfig):
    """Recurrent SAC from replay; the run's shared fields come from RunConfig."""
    env: str = "Pendulum-v1"
    """gymnasium id with a Box action space"""
    keep: str = "0,1"
    """observation indices kept: "0,1" Pendulum-P (cos, sin), "2" Pendulum-V (velocity), "all" """
    total_frames: int = 50_000
    """env frames of the run (rounded up to whole collections; the default run takes 12 to 20 minutes on a
    2-core CPU)"""
    obs_norm: bool = False
    """normalize observations by their running mean and std (evaluated with the statistics frozen)"""
    reward_norm: bool = False
    """divide rewards by the running std of the discounted return (ReturnScaledReward)"""
    collect_len: int = 16
    """steps per env per collector batch; frames per batch = num_envs * collect_len"""
    net: Literal["recurrent", "ff", "framestack"] = "recurrent"
    """recurrent actor and critic (RecurrentSACLoss), or TorchRL's SACLoss on the observation / a frame stack"""
    replay: Literal["streams", "sequence", "slice"] = "streams"
    """recurrent only: stream chunks with the carry, TorchRL's Sequence (burn-in), or its SliceSampler"""
    frames_stacked: int = 4
    """framestack only: observations CatFrames stacks"""
    batch_rows: int = 16
    """B: sequences per gradient step (ff, framestack: B * T transitions)"""
    seq_len: int = 32
    """T: steps per sequence that count in the loss"""
    burn_in: int = 16
    """sequence only: steps unrolled before each sequence from the stored state, out of the loss (R2D2)"""
    buffer_size: int = 1_000_000
    """replay capacity in frames (a multiple of num_envs; sequence: the whole run)"""
    learning_starts: int = 2_000
    """frames collected before the first gradient step"""
    replay_ratio: float = 256.0
    """steps trained (B * T per gradient step) per env frame: 256 with B * T = 512 is one gradient step per two
    frames"""
    hidden: int = 64
    """units of the encoders and the GRUs"""
    cells: int = 128
    """units of the two hidden layers of the policy and Q heads"""
    gamma: float = 0.9
    """discount, in [0, 1]"""
    n_steps: int = 1
    """recurrent only: n of the n-step targets"""
    prev_action: bool = True
    """recurrent only: both encoders also read the previous action (zeros at an episode's first step), as Ni et al. (2022)"""
    prev_reward: bool = False
    """the observation ends with the previous step's reward (0 at an episode's first step; PreviousReward), as Ni
    et al. (2022) feed it; on Pendulum it observes the cost of the angle. The env's raw reward: --obs-norm
    normalizes it with the observation, --reward-norm scales only the reward trained on"""
    lr: float = 3e-4
    """Adam learning rate of the actor, the critics and the temperature, > 0"""
    tau: float = 0.005
    """SoftUpdate rate of the target critic, in (0, 1]"""
    alpha_init: float = 1.0
    """initial entropy temperature, > 0 (tuned to the target entropy -action_dim from there)"""
    eval_every: int = 1_000
    """frames between evaluations (deterministic actions)"""
    eval_episodes: int = 20
    """episodes per evaluation, run side by side"""
    APPLIES: ClassVar[dict] = {
        "replay": ("net", ("recurrent",), " (the feed-forward recipes sample transitions uniformly)"),
        "n_steps": ("net", ("recurrent",), " (TorchRL's SACLoss: one-step targets)"),
        "prev_action": ("net", ("recurrent",), " (the feed-forward recipes read the observation alone)"),
        "burn_in": ("replay", ("sequence",), ""),
        "frames_stacked": ("net", ("framestack",), ""),
    }

    def __post_init__(self) -> None:
        self.check()
        if not self.name:
            recipe = self.net + (f"_{self.replay}{'' if self.prev_action else '_noprev'}" if self.net == "recurrent"
                                 else "") + ("_prevreward" if self.prev_reward else "")
            self.name = f"{env_name(self.env, self.keep)}_sac_{recipe}_seed{self.seed}"

    def check(self) -> None:
        """Every option against its meaning; a ValueError names the flag and the fix."""
        self.check_run()
        for name, low in {"collect_len": 1, "frames_stacked": 1, "batch_rows": 1, "seq_len": 1, "burn_in": 0,
                          "buffer_size": 1, "learning_starts": 0, "hidden": 1, "cells": 1, "n_steps": 1,
                          "eval_every": 1, "eval_episodes": 1}.items():
            options.integer(name, getattr(self, name), low)
        options.real("gamma", self.gamma, 0.0, 1.0)
        options.real("tau", self.tau, 0.0, 1.0, open_low=True)
        for name in ("replay_ratio", "lr", "alpha_init"):
            options.real(name, getattr(self, name), 0.0, open_low=True)
        if self.buffer_size % self.num_envs or self.buffer_size < self.num_envs * self.collect_len:
            raise ValueError(f"--buffer-size ({self.buffer_size}) must be a multiple of --num-envs ({self.num_envs}) "
                             f"and hold a collector batch ({self.num_envs * self.collect_len} frames).")
        if self.windows == "sequence" and self.buffer_size < self.planned_frames:
            raise ValueError(f"--replay sequence keeps every frame (TorchRL's Sequence repeats the oldest record where "
                             f"a burn-in reaches before it): --buffer-size must be >= {self.planned_frames}.")
        if self.episode_steps is None:
            raise ValueError(f"--env {self.env} has no step limit, so an evaluation episode may never end: "
                             "give --max-episode-steps.")
        if self.planned_grad_steps < 1:
            raise ValueError("--learning-starts, --replay-ratio and --total-frames leave no gradient step: lower "
                             "--learning-starts or raise --total-frames or --replay-ratio.")

    @property
    def windows(self) -> str:
        """How training batches come from replay: streams, sequence, slice, or transitions."""
        return self.replay if self.net == "recurrent" else "transitions"

    @property
    def episode_steps(self) -> int | None:
        """The episodes' step limit (--max-episode-steps, else the env's), None if it has none."""
        return self.max_episode_steps or gym.spec(self.env.rpartition(":")[2]).max_episode_steps

    @property
    def planned_frames(self) -> int:
        """--total-frames rounded up to whole collector batches."""
        per_batch = self.num_envs * self.collect_len
        return -(-self.total_frames // per_batch) * per_batch

    @property
    def planned_grad_steps(self) -> int:
        """Gradient steps of a whole run: the replay ratio from the batch that reaches --learning-starts."""
        per_batch = self.num_envs * self.collect_len
        before = max(-(-self.learning_starts // per_batch) - 1, 0) * per_batch
        return int(self.replay_ratio * max(self.planned_frames - before, 0) / (self.batch_rows * self.seq_len))


def box_actions(cfg: Config, env):
    """The env's unbatched action spec; a ValueError unless it is a bounded vector (a gymnasium Box)."""
    spec = env.full_action_spec_unbatched["action"]
    if len(spec.shape) != 1 or not hasattr(spec.space, "low") or spec.dtype.is_floating_point is False:
        raise ValueError(f"--env {cfg.env}: its actions are {type(spec).__name__} {list(spec.shape)}; SAC here acts "
                         "in a bounded vector of reals (a gymnasium Box), e.g. Pendulum-v1.")
    return spec


def make_nets(cfg: Config, env) -> dict:
    """The actor (TanhNormal on the action's bounds) and the critic: for --net recurrent an encoder
    (of the observation and, with --prev-action, the previous action) and a ResetRNN(GRU) each, one
    critic trunk under twin Q heads (RecurrentSACLoss copies the head); else MLPs on the observation
    (a frame stack for framestack). "act": the actor as it acts, writing ``("next", PREV)``."""
    spec = box_actions(cfg, env)
    obs_dim, act_dim = env.observation_spec["observation"].shape[-1], spec.shape[-1]
    head = lambda n_in, n_out: MLP(in_features=n_in, out_features=n_out, num_cells=[cfg.cells] * 2,  # noqa: E731
                                   activation_class=nn.ReLU)

    def actor(body, features, n_in):
        params = Mod(nn.Sequential(head(n_in, 2 * act_dim), NormalParamExtractor()), [features], ["loc", "scale"])
        return ProbabilisticActor(Seq(*body, params), in_keys=["loc", "scale"], distribution_class=TanhNormal,
                                  distribution_kwargs={"low": spec.space.low, "high": spec.space.high}, spec=spec)

    if cfg.net != "recurrent":
        q = Mod(head(obs_dim + act_dim, 1), ["observation", "action"], ["state_action_value"])
        policy = actor([], "observation", obs_dim)
        return {"actor": policy, "act": policy, "qvalue": q, "rnns": [], "spec": spec}

    def trunk(name):  # the loss starts every row through the reset state (carried, stored or zeros)
        rnn = ResetRNN(nn.GRU(cfg.hidden, cfg.hidden, batch_first=True), in_key=f"{name}_embed",
                       out_key=f"{name}_features", state_key=f"{name}_state", reset_state_key=f"{name}_state")
        inputs = ["observation", PREV] if cfg.prev_action else ["observation"]  # MLP concatenates its inputs
        embed = MLP(in_features=obs_dim + act_dim * cfg.prev_action, out_features=cfg.hidden, num_cells=[],
                    activation_class=nn.Tanh, activate_last_layer=True)
        return [Mod(embed, inputs, [f"{name}_embed"]), rnn], rnn

    actor_body, actor_rnn = trunk("actor")
    critic_body, critic_rnn = trunk("critic")
    q = Mod(head(cfg.hidden + act_dim, 1), ["critic_features", "action"], ["state_action_value"])
    policy = actor(actor_body, "actor_features", cfg.hidden)
    act = Seq(policy, Mod(nn.Identity(), ["action"], [("next", PREV)])) if cfg.prev_action else policy
    return {"actor": policy, "act": act, "critic": Seq(*critic_body), "qvalue": q,
            "rnns": [actor_rnn, critic_rnn], "spec": spec}


def make_env(cfg: Config, rnns: list, num_envs: int, seed: int, obs_norm=None):
    """The run's env for num_envs envs with the primers of the acting ResetRNNs and PREV (and CatFrames
    for framestack); ``obs_norm``: an evaluation env normalizing with those statistics, frozen."""
    sub = copy.copy(cfg)  # not checked again: only the envs differ
    sub.num_envs = num_envs
    if obs_norm is not None:
        sub.obs_norm = sub.reward_norm = False
    env = envs.make_env(sub)
    if obs_norm is not None:
        env.append_transform(obs_norm.frozen_copy())
    if cfg.net == "framestack":
        env.append_transform(CatFrames(N=cfg.frames_stacked, dim=-1, in_keys=["observation"]))
    specs = {key: spec for rnn in rnns for key, spec in rnn.make_tensordict_primer().primers.items(True, True)}
    if rnns and cfg.prev_action:  # zeros at every reset, the last action after every step
        specs[PREV] = Unbounded(box_actions(cfg, env).shape, dtype=torch.get_default_dtype())
    if specs:
        env.append_transform(TensorDictPrimer(specs, expand_specs=True))
    env.set_seed(seed)
    return env


def make_buffer(cfg: Config) -> TensorDictReplayBuffer:
    """B stream chunks [B, T], B windows of burn-in + T steps (Sequence) or T steps (SliceSampler)
    from a [time, env] storage, or B * T uniform transitions."""
    generator = torch.Generator().manual_seed(cfg.seed)
    steps = cfg.batch_rows * cfg.seq_len
    if cfg.windows in ("streams", "transitions"):
        sampler = (StreamChunkSampler(cfg.batch_rows, cfg.seq_len, traj_key=("collector", "traj_ids"),
                                      only_complete=False, generator=generator)
                   if cfg.windows == "streams" else RandomSampler())
        return TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), sampler=sampler, batch_size=steps,
                                      generator=None if cfg.windows == "streams" else generator)
    storage = LazyTensorStorage(cfg.buffer_size, ndim=2)  # [time, env]: each env's steps in order
    if cfg.windows == "sequence":
        unit = Sequence(length=cfg.seq_len, episode_boundary="include_reset", burn_in=cfg.burn_in)
        return TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=cfg.batch_rows, generator=generator)
    sampler = SliceSampler(slice_len=cfg.seq_len, end_key=("next", "done"), strict_length=False, pad_output=True,
                           init_key=None)  # the stored is_init flags stay
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=steps, generator=generator)


def write(cfg: Config, buffer: TensorDictReplayBuffer, batch: TensorDictBase) -> None:
    """A collector batch [num_envs, collect_len] into the buffer: STEP_KEYS, plus the stored
    memories where windows start from them."""
    batch = batch.select(*STEP_KEYS, *(STORED if cfg.windows in ("sequence", "slice") else []), strict=False)
    buffer.extend(batch if cfg.windows in ("sequence", "slice") else batch.reshape(-1))


def sample(cfg: Config, buffer: TensorDictReplayBuffer) -> TensorDictBase:
    """A training batch: a [B, T] chunk (is_first from the sampler), B * T transitions, or B windows
    [B, L] with is_first (the env's is_init) and LEARN. A window's steps before its first real
    record (Sequence's repeats) are ended one-step episodes, those after its last real one
    (padding) one episode of their own, all out of the loss."""
    batch = buffer.sample()
    if cfg.windows in ("streams", "transitions"):
        return batch
    batch = batch.reshape(cfg.batch_rows, -1)
    if cfg.windows == "sequence":
        valid = batch["validity_mask"]
        learn = batch["learning_mask"] & valid
    else:
        valid = learn = batch.get(("collector", "mask"), torch.ones(batch.shape, dtype=torch.bool))
    return mark_outside(batch, valid, learn, LEARN)


def make_loss(cfg: Config, nets: dict):
    """RecurrentSACLoss (carry for streams, the stored memories for windows), or TorchRL's SACLoss;
    with its SoftUpdate."""
    common = dict(loss_function="l2", action_spec=nets["spec"], alpha_init=cfg.alpha_init)
    if cfg.net == "recurrent":
        loss = RecurrentSACLoss(nets["actor"], nets["rnns"][0], nets["critic"], nets["rnns"][1], nets["qvalue"],
                                gamma=cfg.gamma, n_steps=cfg.n_steps, **common,
                                initial_state="carry" if cfg.windows == "streams" else "stored",
                                mask_key=None if cfg.windows == "streams" else LEARN,
                                burn_in=cfg.burn_in if cfg.windows == "sequence" else 0)
    else:
        loss = SACLoss(nets["actor"], nets["qvalue"], num_qvalue_nets=2, delay_qvalue=True, **common)
        loss.make_value_estimator(gamma=cfg.gamma)
    return loss, SoftUpdate(loss, tau=cfg.tau)


def evaluate(env, actor, steps: int) -> list[float]:
    """The return of each env's first episode under deterministic actions (the policy's mode)."""
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC), set_recurrent_mode(False):
        rollout = env.rollout(steps, actor, break_when_any_done=False)  # [N, steps]
    done = rollout["next", "done"].squeeze(-1)
    first = done.long().argmax(1)
    ended = done.any(1)
    return rollout["next", "episode_reward"][torch.arange(done.shape[0]), first].squeeze(-1)[ended].tolist()


def check_actions(cfg: Config) -> None:
    env = make_env(cfg, [], 1, cfg.seed)
    try:
        box_actions(cfg, env)
    finally:
        env.close()


def check_command(cfg: Config) -> Config:
    """The checks of a command line beyond ``cfg.check()``: ``--keep`` and the actions against one
    env of the run, and the run folder. Returns ``cfg``; a ValueError names the flag and the fix."""
    envs.check_keep(cfg)
    check_actions(cfg)
    report.check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def train(cfg: Config) -> Run:
    """One run of ``cfg``, writing ``<runs_dir>/<name>/``: its Run (metrics rows, one per collector
    batch; the run folder; metrics.csv and learning_curve.png).

    Examples:
        >>> from torchrl_seqchunk.recipes import sac
        >>> sac.Config(replay="sequence").name  # the run's folder under runs/
        'Pendulum-v1_keep0,1_sac_recurrent_sequence_seed0'
    """
    cfg.check()
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    out_dir = report.check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    nets = make_nets(cfg, make_env(cfg, [], 1, cfg.seed))
    acting = nets["rnns"] if cfg.windows in ("sequence", "slice") else nets["rnns"][:1]  # whose memory is stored
    policy = Seq(nets["act"], nets["critic"]) if len(acting) == 2 else nets["act"]
    env = make_env(cfg, acting, cfg.num_envs, cfg.seed)
    per_batch, planned = cfg.num_envs * cfg.collect_len, cfg.planned_frames
    collector = (Collector(env, policy, frames_per_batch=per_batch, total_frames=planned)
                 if cfg.net == "framestack" else envs.make_collector(cfg, env, policy, per_batch, planned))
    buffer, (loss, updater) = make_buffer(cfg), make_loss(cfg, nets)
    optim = torch.optim.Adam(loss.parameters(), lr=cfg.lr)
    eval_env = None
    log = report.Report(out_dir, planned_frames=planned, target=cfg.target, return_window=cfg.return_window,
                        progress=cfg.progress)
    learned, grad_steps, recurrent_steps, learn_s, eval_s = 0, 0, 0, 0.0, 0.0
    last = {"loss_actor": float("nan"), "loss_qvalue": float("nan"), "alpha": float("nan"),
            "entropy": float("nan"), "eval_return": float("nan"), "eval_frames": 0}
    for batch in collector:  # [num_envs, collect_len]
        torch.set_num_threads(cfg.threads)  # TorchRL's batched env raises it when it closes
        write(cfg, buffer, batch)
        if log.frames + batch.numel() >= cfg.learning_starts:
            learned += batch.numel()
        due, start = int(cfg.replay_ratio * learned / (cfg.batch_rows * cfg.seq_len)), time.perf_counter()
        while grad_steps < due:
            out = loss(sample(cfg, buffer).to(cfg.device))
            optim.zero_grad()
            (out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]).backward()
            optim.step()
            updater.step()
            grad_steps += 1
            recurrent_steps += int(out.get("recurrent_steps", 0))
            last.update({k: out[k].item() for k in ("loss_actor", "loss_qvalue", "alpha", "entropy")})
        learn_s += time.perf_counter() - start
        frames = log.frames + batch.numel()
        if frames // cfg.eval_every > last["eval_frames"] // cfg.eval_every or frames == planned:
            start = time.perf_counter()
            if eval_env is None or cfg.obs_norm:  # the training statistics as they are now
                eval_env = make_env(cfg, nets["rnns"][:1], cfg.eval_episodes, cfg.seed + 10**6,
                                    envs.obs_norm_of(env) if cfg.obs_norm else None)
            returns = evaluate(eval_env, nets["act"], cfg.episode_steps)
            last.update(eval_return=sum(returns) / len(returns) if returns else float("nan"), eval_frames=frames)
            eval_s += time.perf_counter() - start
        log.add(batch.numel(), report.finished_returns(batch),
                {**last, "grad_steps": grad_steps, "learn_s": round(learn_s, 3), "eval_s": round(eval_s, 3),
                 "recurrent_steps_per_grad_step": recurrent_steps / max(grad_steps, 1)})
    collector.shutdown()
    return log.close(cfg.name)
