"""Recurrent Q-learning from replay (R2D2-style), composed from TorchRL and torchrl_seqchunk.

Default task: CartPole-v1 without its velocity components, as the main job's (``seqchunk ppo``). Double DQN
with n-step returns, a target network (TorchRL's SoftUpdate, or HardUpdate), per-env
epsilon-greedy (env i explores with eps_base ** (1 + eps_alpha * i / (num_envs - 1)), as
Ape-X and R2D2 do) and a replay ratio. `--replay` chooses how training sequences come
from replay, everything else equal:

    seqchunk dqn                        # streams: [B, T] stream chunks, carried state
    seqchunk dqn --stream-groups 4      # 4 B streams, trained B rows at a time in turn
    seqchunk dqn --overlap 10           # stream chunks overlapping by 10 steps, burnt in
    seqchunk dqn --replay sequence      # TorchRL's Sequence unit, stored state + burn-in
    seqchunk dqn --replay slice         # TorchRL's SliceSampler, stored state
    seqchunk dqn --replay slice --initial-state zero   # the zero-state baseline
    seqchunk dqn --env popgym:popgym-RepeatPreviousEasy-v0

Pipeline per iteration:
  1. the main job's collector steps `num_envs` envs (VectorEnvCollector on the in-process vector
     env, TorchRL's Collector with `--env-batching serial` / `parallel`: the same rollouts from
     the same random state, but the Collector calls the policy once when it is built, an
     epsilon-greedy draw, so the two runs of a seed differ; observations normalized by
     VecNormV2's rule, RunningObservationNorm: the masked task does not learn from raw ones);
     the Q-network runs ResetRNN in step mode, so the buffer stores the memory it had at every step;
  2. the batch goes into a TensorDictReplayBuffer, only the keys the recipe trains on (the
     stored memory only where a window starts from it): flat for StreamChunkSampler(B, T),
     or a [time, env] storage for TorchRL's Sequence(T + burn-in, "include_reset") and
     SliceSampler(T);
  3. `replay_ratio * frames / (B * T)` gradient steps of RecurrentDQNLoss, whose n-step
     targets are right at every boundary; `streams` carries each network's state per
     stream from a chunk to the next (with --stream-groups K > 1 it keeps K x B streams,
     draws [K B, T] chunks and trains B rows of one at a time, in turn; with --overlap K
     each chunk first unrolls, without gradient, the last K steps of its stream's previous
     chunk, from the carry taken before them); the others start
     each window from the stored (or a zero) state
     (`sequence` first unrolls its burn-in steps without gradient) and reset at every
     episode start, the window's first step too.
Writes runs/<name>/metrics.csv and runs/<name>/learning_curve.png.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import ClassVar, Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Categorical, OneHot
from torchrl.modules import MLP, EGreedyModule, QValueModule
from torchrl.objectives import HardUpdate, SoftUpdate

from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN
from torchrl_seqchunk.envs import make_masked_env

from . import dqn_replay
from .common import envs, options
from .common.agent import recurrent_layer
from .common.config import RunConfig, env_name
from .common.report import Report, Run, check_run_folder, finished_returns

__all__ = ["Config", "Run", "check_command", "make_loss", "make_qnet", "train"]

NAMED = ("stream_groups", "overlap", "batch_rows", "seq_len", "burn_in")
"""Options that change the recipe's sequences, named in a run's default --name when not at their default."""


@dataclasses.dataclass
class Config(RunConfig):
    """Recurrent double n-step DQN from replay; the run's shared fields come from RunConfig."""
    total_frames: int = 60_000
    """env frames of the run"""
    num_envs: int = 8
    """envs stepped by the collector, each with its own epsilon"""
    reward_norm: bool = False
    """divide rewards by the running std of the discounted return (ReturnScaledReward)"""
    # collection
    collect_len: int = 16
    """steps per env per collector batch; frames per batch = num_envs * collect_len"""
    eps_base: float = 0.4
    """per-env epsilon-greedy: env i explores with eps_base ** (1 + eps_alpha * i / (num_envs - 1))"""
    eps_alpha: float = 7.0
    """per-env epsilon-greedy exponent spread"""
    # replay
    replay: Literal["streams", "sequence", "slice"] = "streams"
    """stream chunks with a carried state, TorchRL's Sequence unit (burn-in), or its SliceSampler"""
    initial_state: Literal["stored", "zero"] = "stored"
    """sequence / slice only: each window starts from the actor's stored memory, or from zeros"""
    batch_rows: int = 16
    """B: sequences per gradient step"""
    stream_groups: int = 1
    """streams only: stream_groups x B streams kept, B of them trained per gradient step, in turn"""
    overlap: int = 0
    """streams only: steps a chunk shares with its stream's previous one, unrolled again without
    gradient from the carry taken before them (burn-in on stream chunks, a fresher memory); < --seq-len"""
    seq_len: int = 20
    """T: steps per sequence that count in the loss"""
    burn_in: int = 10
    """sequence only: steps unrolled before each sequence, without gradient and out of the loss (R2D2)"""
    buffer_size: int = 100_000
    """replay capacity in frames (a multiple of num_envs)"""
    learning_starts: int = 2_000
    """frames collected before the first gradient step"""
    replay_ratio: float = 16.0
    """steps trained (B * T per gradient step) per env frame"""
    # model and loss
    hidden: int = 64
    """units of the encoder, the GRU and the Q head"""
    rnn: Literal["resetrnn", "torchrl"] = "resetrnn"
    """recurrent module: ResetRNN over nn.GRU, or TorchRL's GRUModule inside ResetRNN (TorchRL's keys; the same weights and results)"""
    gamma: float = 0.99
    """discount, in [0, 1]"""
    n_steps: int = 3
    """n of the n-step targets"""
    double_dqn: bool = True
    """the online network picks the next action, the target network values it"""
    lr: float = 5e-4
    """Adam learning rate, > 0"""
    max_grad_norm: float = 10.0
    """global gradient norm clip, > 0"""
    tau: float = 0.01
    """SoftUpdate rate of the target network, in (0, 1]"""
    hard_update: int = 0
    """gradient steps between HardUpdate copies of the target network; 0: SoftUpdate with --tau"""
    APPLIES: ClassVar[dict[str, tuple[str | None, tuple | range, str]]] = {
        "initial_state": ("replay", ("sequence", "slice"), " (stream chunks start from the carried state)"),
        "stream_groups": ("replay", ("streams",), ""),
        "overlap": ("replay", ("streams",), " (sequence windows burn in with --burn-in)"),
        "burn_in": ("replay", ("sequence",), ""),
        "tau": ("hard_update", (0,), " (above 0, HardUpdate copies the weights every --hard-update steps)"),
        "eps_alpha": ("num_envs", range(2, 2**63), " (it spreads epsilon over the envs; one env explores with --eps-base)"),
    }

    def __post_init__(self) -> None:
        self.check()
        if not self.name:
            start = "carry" if self.replay == "streams" else self.initial_state
            # the recipe's shape, where it differs from the defaults (an ablation gets a folder of its own)
            shape = "".join(f"_{field.replace('_', '-')}{getattr(self, field)}" for field in NAMED
                            if getattr(self, field) != getattr(Config, field))
            self.name = f"{env_name(self.env, self.keep)}_dqn_{self.replay}_{start}{shape}_seed{self.seed}"

    def check(self) -> None:
        """Every option against its meaning; a ValueError names the flag and the fix."""
        self.check_run()
        ints = {"collect_len": 1, "batch_rows": 1, "stream_groups": 1, "overlap": 0, "seq_len": 1, "burn_in": 0,
                "buffer_size": 1, "learning_starts": 0, "hidden": 1, "n_steps": 1, "hard_update": 0}
        for name, low in ints.items():
            options.integer(name, getattr(self, name), low)
        options.real("gamma", self.gamma, 0.0, 1.0)
        options.real("eps_base", self.eps_base, 0.0, 1.0)
        options.real("eps_alpha", self.eps_alpha, 0.0)
        for name in ("replay_ratio", "lr", "max_grad_norm"):
            options.real(name, getattr(self, name), 0.0, open_low=True)
        options.real("tau", self.tau, 0.0, 1.0, open_low=True)
        if self.buffer_size % self.num_envs:
            raise ValueError(f"--buffer-size ({self.buffer_size}) must be a multiple of --num-envs "
                             f"({self.num_envs}): the sequence and slice storages hold [time, env].")
        if self.overlap >= self.seq_len:
            raise ValueError(f"--overlap ({self.overlap}) must be below --seq-len ({self.seq_len}): the carry is "
                             "taken before a chunk's last --overlap steps, after at least one learned step.")
        if self.buffer_size < self.frames_per_batch:
            raise ValueError(f"--buffer-size ({self.buffer_size}) must hold a collector batch "
                             f"(--num-envs x --collect-len = {self.frames_per_batch} frames).")
        if self.replay != "streams" and self.buffer_size // self.num_envs < self.window:
            raise ValueError(f"--buffer-size ({self.buffer_size}) holds {self.buffer_size // self.num_envs} steps "
                             f"per env, fewer than a window of {self.window} (--seq-len, plus --burn-in for "
                             "sequence): raise --buffer-size.")
        if self.planned_grad_steps < 1:
            raise ValueError(f"--learning-starts {self.learning_starts}, --replay-ratio {self.replay_ratio} and "
                             f"--total-frames {self.total_frames} leave no gradient step (each trains --batch-rows "
                             "x --seq-len steps): lower --learning-starts or raise --total-frames or --replay-ratio.")

    @property
    def frames_per_batch(self) -> int:
        """Frames per collector batch: --num-envs x --collect-len."""
        return self.num_envs * self.collect_len

    @property
    def planned_frames(self) -> int:
        """--total-frames rounded up to whole collector batches."""
        return -(-self.total_frames // self.frames_per_batch) * self.frames_per_batch

    @property
    def planned_grad_steps(self) -> int:
        """Gradient steps of a whole run: the replay ratio from the batch that reaches --learning-starts."""
        before = max(-(-self.learning_starts // self.frames_per_batch) - 1, 0) * self.frames_per_batch
        return int(self.replay_ratio * max(self.planned_frames - before, 0) / (self.batch_rows * self.seq_len))

    @property
    def window(self) -> int:
        """Steps unrolled per sequence: T, plus the burn-in for --replay sequence (the overlap for streams)."""
        return self.seq_len + {"sequence": self.burn_in, "streams": self.overlap}.get(self.replay, 0)


def discrete_actions(cfg: Config, env):
    """The env's unbatched action spec (QValueModule takes one env's); a ValueError unless it is
    one choice among n (a gymnasium Discrete space)."""
    spec = env.full_action_spec_unbatched["action"]
    if not ((type(spec) is OneHot and len(spec.shape) == 1) or (type(spec) is Categorical and not spec.shape)):
        raise ValueError(f"--env {cfg.env}: its actions are {type(spec).__name__} {list(spec.shape)}; Q-learning "
                         "here picks one of n actions (a gymnasium Discrete action space), e.g. CartPole-v1 or "
                         "a POPGym task with one discrete action.")
    return spec


def check_actions(cfg: Config) -> None:
    """Builds one env of the run to check its actions (:func:`discrete_actions`)."""
    env = make_masked_env(cfg.env, envs.kept_indices(cfg))
    try:
        discrete_actions(cfg, env)
    finally:
        env.close()


def make_qnet(cfg: Config, env) -> tuple[TensorDictSequential, ResetRNN, TensorDictSequential]:
    """Q-network (encoder -> ResetRNN(GRU) -> Q head), its ResetRNN and the acting policy
    (Q-network -> QValueModule -> per-env EGreedyModule), shaped by ``env``'s specs: reads
    "observation" ``[*, obs_dim]``, writes "action_value" ``[*, n]``; a ValueError unless the
    env picks one of n actions."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = discrete_actions(cfg, env)
    # the loss starts every row through the reset state (carried, stored or zeros)
    rnn = recurrent_layer(cfg.rnn, "gru", cfg.hidden, cfg.hidden, in_key="q_embed", out_key="q_features",
                          state_key="q_state")
    qnet = TensorDictSequential(
        TensorDictModule(nn.Sequential(nn.Linear(obs_dim, cfg.hidden), nn.Tanh()), ["observation"], ["q_embed"]),
        rnn,
        TensorDictModule(MLP(in_features=cfg.hidden, out_features=action_spec.shape[-1], num_cells=[cfg.hidden],
                             activation_class=nn.ReLU), ["q_features"], ["action_value"]),
    )
    explore = EGreedyModule(action_spec, eps_init=cfg.eps_base, eps_end=cfg.eps_base)
    spread = torch.arange(cfg.num_envs) / max(cfg.num_envs - 1, 1)
    eps = cfg.eps_base ** (1 + cfg.eps_alpha * spread)  # [num_envs], constant
    explore.eps, explore.eps_init, explore.eps_end = eps.clone(), eps.clone(), eps.clone()
    policy = TensorDictSequential(qnet, QValueModule(spec=action_spec, action_value_key="action_value"), explore)
    return qnet, rnn, policy


def make_loss(cfg: Config, qnet, rnn) -> tuple[RecurrentDQNLoss, HardUpdate | SoftUpdate]:
    """The recipe's RecurrentDQNLoss over ``qnet`` and its ``rnn`` (how each row starts and
    what it burns in, by ``--replay``), and the target network's updater."""
    loss = RecurrentDQNLoss(
        qnet, rnn, gamma=cfg.gamma, n_steps=cfg.n_steps, double_dqn=cfg.double_dqn,
        initial_state="carry" if cfg.replay == "streams" else cfg.initial_state,
        mask_key=None if cfg.replay == "streams" else dqn_replay.LEARN,
        # unrolled without gradient (R2D2); streams: the overlap with the stream's previous chunk
        burn_in={"sequence": cfg.burn_in, "streams": cfg.overlap}.get(cfg.replay, 0),
        overlap=cfg.replay == "streams" and cfg.overlap > 0,
        # a carry per stream; with one group, row b is stream b (no ids needed)
        stream_key=dqn_replay.STREAM if cfg.replay == "streams" and cfg.stream_groups > 1 else None,
    )
    updater = (HardUpdate(loss, value_network_update_interval=cfg.hard_update) if cfg.hard_update
               else SoftUpdate(loss, tau=cfg.tau))
    return loss, updater


def check_command(cfg: Config) -> Config:
    """The checks of a command line beyond ``cfg.check()``: ``--keep`` and the actions against
    one env of the run, and the run folder (a finished run is kept unless ``--overwrite``).
    Returns ``cfg``; a ValueError names the flag and the fix."""
    envs.check_keep(cfg)
    check_actions(cfg)
    check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def train(cfg: Config) -> Run:
    """Trains the recurrent DQN as ``cfg`` says, writing ``<runs_dir>/<name>/``; returns the Run
    (metrics rows: frames, wall_s, episodes, return_mean, the last loss and TD error,
    grad_steps, learn_s and recurrent_steps_per_grad_step per collector batch). A ValueError
    names the option and the fix.

    Examples:
        >>> from torchrl_seqchunk.recipes import dqn
        >>> dqn.Config(replay="sequence").name  # the run's folder under runs/
        'CartPole-v1_dqn_sequence_stored_seed0'
    """
    cfg.check()  # a Config built in code is checked as a command line is
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # not the storage's size at its first write
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    frames_per_batch, planned_frames = cfg.frames_per_batch, cfg.planned_frames
    out_dir = check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    qnet, rnn, policy = make_qnet(cfg, envs.make_env(cfg, warn=True))
    env = envs.make_acting_env(cfg, [rnn], cfg.seed)
    collector = envs.make_collector(cfg, env, policy.to(cfg.device), frames_per_batch, planned_frames)
    buffer = dqn_replay.make_buffer(cfg)
    training = dqn_replay.batches(cfg, buffer)
    loss_module, updater = make_loss(cfg, qnet, rnn)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr)
    log = Report(out_dir, planned_frames=planned_frames, target=cfg.target, return_window=cfg.return_window,
                 stop_at_target=cfg.stop_at_target, progress=cfg.progress)
    learned_frames, grad_steps, recurrent_steps, learn_s = 0, 0, 0, 0.0
    last = {"loss": float("nan"), "td_error": float("nan")}
    for batch in collector:  # [num_envs, collect_len]
        torch.set_num_threads(cfg.threads)  # TorchRL's batched env raises it when it closes
        dqn_replay.write(cfg, buffer, batch)
        if log.frames + batch.numel() >= cfg.learning_starts:
            learned_frames += batch.numel()
        # the steps due so far, counted as planned_grad_steps counts them (a running float credit
        # could fall short of a whole step by a rounding error)
        due = int(cfg.replay_ratio * learned_frames / (cfg.batch_rows * cfg.seq_len))
        start = time.perf_counter()
        while grad_steps < due:
            out = loss_module(next(training).to(cfg.device))
            optim.zero_grad()
            out["loss"].backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
            optim.step()
            updater.step()
            grad_steps += 1
            recurrent_steps += int(out["recurrent_steps"])
            last = {"loss": out["loss"].item(), "td_error": out["td_error"].item()}
        learn_s += time.perf_counter() - start
        log.add(batch.numel(), finished_returns(batch),
                {**last, "grad_steps": grad_steps, "learn_s": round(learn_s, 3),
                 "recurrent_steps_per_grad_step": recurrent_steps / max(grad_steps, 1)})
        if log.reached:
            break
    collector.shutdown()
    return log.close(cfg.name)
