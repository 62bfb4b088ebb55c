"""Recurrent Q-learning from replay (R2D2-style), composed from TorchRL and torchrl_seqchunk.

Default task: CartPole-v1 without its velocity components, as the main job's. Double DQN
with n-step returns, a target network (TorchRL's SoftUpdate, or HardUpdate), per-env
epsilon-greedy (env i explores with eps_base ** (1 + eps_alpha * i / (num_envs - 1)), as
Ape-X and R2D2 do) and a replay ratio. `--replay` chooses how training sequences come
from replay, everything else equal:

    python examples/recurrent_dqn.py                        # streams: [B, T] stream chunks, carried state
    python examples/recurrent_dqn.py --stream-groups 4      # 4 B streams, trained B rows at a time in turn
    python examples/recurrent_dqn.py --overlap 10           # stream chunks overlapping by 10 steps, burnt in
    python examples/recurrent_dqn.py --replay sequence      # TorchRL's Sequence unit, stored state + burn-in
    python examples/recurrent_dqn.py --replay slice         # TorchRL's SliceSampler, stored state
    python examples/recurrent_dqn.py --replay slice --initial-state zero   # the zero-state baseline
    python examples/recurrent_dqn.py --env popgym:popgym-RepeatPreviousEasy-v0

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
import re
import time
from typing import ClassVar, Literal

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Categorical, LazyTensorStorage, OneHot, SliceSampler, TensorDictReplayBuffer
from torchrl.data.replay_buffers.sample_units import Sequence
from torchrl.modules import MLP, EGreedyModule, QValueModule
from torchrl.objectives import HardUpdate, SoftUpdate

from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN, StreamChunkSampler
from torchrl_seqchunk.envs import make_masked_env

from torchrl_seqchunk.recipes.common import envs, options, report  # examples/common
from torchrl_seqchunk.recipes.common.config import RunConfig
from torchrl_seqchunk.recipes.common.report import finished_returns

LEARN = "learn"  # bool [B, L]: the steps of a window that count in the loss
STREAM = "stream"  # long [B, T]: the stream a row of stream chunks continues


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
            self.name = (f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.env)}_dqn_{self.replay}_{start}{shape}"
                         f"_seed{self.seed}")

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
    (Q-network -> QValueModule -> per-env EGreedyModule)."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = discrete_actions(cfg, env)
    rnn = ResetRNN(nn.GRU(cfg.hidden, cfg.hidden, batch_first=True), in_key="q_embed", out_key="q_features",
                   # the loss starts every row through the reset state (carried, stored or zeros)
                   state_key="q_state", reset_state_key="q_state")
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


def make_buffer(cfg: Config) -> TensorDictReplayBuffer:
    """The recipe's replay buffer: B sequences of `cfg.window` steps per sample, or [P, T]
    chunks of the P = stream_groups x B streams."""
    generator = torch.Generator().manual_seed(cfg.seed)
    if cfg.replay == "streams":
        streams = cfg.stream_groups * cfg.batch_rows
        sampler = StreamChunkSampler(streams, cfg.seq_len, traj_key=("collector", "traj_ids"),
                                     only_complete=False, generator=generator)
        return TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.buffer_size), sampler=sampler,
                                      batch_size=streams * cfg.seq_len)
    storage = LazyTensorStorage(cfg.buffer_size, ndim=2)  # [time, env]: each env's steps in order
    if cfg.replay == "sequence":
        unit = Sequence(length=cfg.seq_len, episode_boundary="include_reset", burn_in=cfg.burn_in)
        return TensorDictReplayBuffer(storage=storage, sample_unit=unit, batch_size=cfg.batch_rows,
                                      generator=generator)
    # init_key=None: the stored is_init flags stay; the window's first step starts from the
    # stored state unless it is an episode start (then from zeros)
    sampler = SliceSampler(slice_len=cfg.seq_len, end_key=("next", "done"), strict_length=False,
                           pad_output=True, init_key=None)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=cfg.batch_rows * cfg.seq_len,
                                  generator=generator)


STEP_KEYS = ["observation", "action", "is_init", ("collector", "traj_ids"),
             *(("next", key) for key in ("observation", "reward", "done", "terminated", "truncated"))]
"""What every recipe trains on; the actor's other outputs (features, values) are not stored."""


def write(cfg: Config, buffer: TensorDictReplayBuffer, batch: TensorDictBase) -> None:
    """Collector batch [num_envs, collect_len] -> the buffer (flat, env after env, for
    streams): the STEP_KEYS, plus the actor's memory where a window starts from it
    (stream chunks start from the carried state, so their steps store no memory)."""
    stored = [] if cfg.replay == "streams" or cfg.initial_state == "zero" else ["q_state"]
    batch = batch.select(*STEP_KEYS, *stored, strict=False)
    buffer.extend(batch.reshape(-1) if cfg.replay == "streams" else batch)


def batches(cfg: Config, buffer: TensorDictReplayBuffer):
    """Endless training batches [B, L]: a sample of windows each, or each [P, T] chunk of
    the streams (after the last --overlap steps of the stream's previous chunk) B rows at a
    time, in turn."""
    tail = None
    while True:
        batch = sample(cfg, buffer)
        if cfg.replay == "streams" and cfg.overlap:
            batch, tail = overlapped(batch, tail, cfg.overlap)
        yield from (batch.split(cfg.batch_rows, 0) if cfg.replay == "streams" else (batch,))


def overlapped(chunk: TensorDictBase, tail: TensorDictBase | None, k: int) -> tuple[TensorDictBase, TensorDictBase]:
    """A [P, T] chunk after its streams' previous last k steps ([P, k + T]), and its own last k.

    Before a stream's first chunk there is nothing to burn in: k copies of its first step,
    each an episode of one step, so the chunk's first step starts from zeros (it is an
    episode start anyway: streams begin with whole episodes)."""
    if tail is None:
        tail = chunk[:, :1].expand(chunk.shape[0], k).clone()
        tail["is_first"] = torch.ones_like(tail["is_first"])
        for key in ("done", "terminated"):
            tail["next", key] = torch.ones_like(tail["next", key])
        tail["next", "truncated"] = torch.zeros_like(tail["next", "truncated"])
    return torch.cat([tail, chunk], 1), chunk[:, -k:].clone()


def sample(cfg: Config, buffer: TensorDictReplayBuffer) -> TensorDictBase:
    """B sequences [B, L] with is_first, and LEARN where they count in the loss (windows);
    or a chunk [P, T] of the P streams, with is_first and each row's STREAM id.

    The steps past a window's real ones (repeats of the newest record, or of a short
    episode's last step) become one episode of their own, out of the loss, so that the
    last real step bootstraps from its own next observation."""
    batch = buffer.sample()
    if cfg.replay == "streams":  # [P, T], is_first from the sampler
        batch[STREAM] = torch.arange(batch.shape[0]).unsqueeze(1).expand(batch.shape)
        return batch
    batch = batch.reshape(cfg.batch_rows, cfg.window)
    if cfg.replay == "sequence":
        batch = from_first_record(batch)
        valid = batch["validity_mask"]
        learn = batch["learning_mask"] & valid
    else:
        valid = learn = batch.get(("collector", "mask"), None)  # written when a slice was padded
        if valid is None:
            valid = learn = torch.ones(batch.shape, dtype=torch.bool)
    past = (~valid & valid.long().cummax(1).values.bool()).unsqueeze(-1)  # after the last real step
    first_past = past & ~torch.cat([torch.zeros_like(past[:, :1]), past[:, :-1]], 1)
    batch["is_first"] = (batch["is_init"] & ~past) | first_past  # the env's InitTracker flags
    for key in ("done", "terminated", "truncated"):
        batch["next", key] = batch["next", key] & ~past
    batch[LEARN] = learn
    return batch


def from_first_record(batch: TensorDictBase) -> TensorDictBase:
    """Sequence windows [B, L] whose burn-in reaches before the oldest stored record (TorchRL's
    Sequence then repeats that record, marked invalid in "validity_mask") moved to start at that
    record, from its own stored memory, instead of unrolling the repeats as steps of the episode.
    A row's steps shift left by its repeats; its last steps, now past its real ones, are marked
    invalid (the burn-in stays the first K steps, so up to K learned steps of such a window are
    only burnt in)."""
    valid = batch["validity_mask"]
    lead = (~valid).long().cumprod(1).sum(1, keepdim=True)  # [B, 1] repeats before the first real record
    if not bool(lead.any()):
        return batch
    steps = torch.arange(batch.shape[1]) + lead
    batch = batch[torch.arange(batch.shape[0]).unsqueeze(1), steps.clamp(max=batch.shape[1] - 1)]
    batch["validity_mask"] = batch["validity_mask"] & (steps < valid.shape[1])
    return batch


def make_loss(cfg: Config, qnet, rnn):
    loss = RecurrentDQNLoss(
        qnet, rnn, gamma=cfg.gamma, n_steps=cfg.n_steps, double_dqn=cfg.double_dqn,
        initial_state="carry" if cfg.replay == "streams" else cfg.initial_state,
        mask_key=None if cfg.replay == "streams" else LEARN,
        # unrolled without gradient (R2D2); streams: the overlap with the stream's previous chunk
        burn_in={"sequence": cfg.burn_in, "streams": cfg.overlap}.get(cfg.replay, 0),
        overlap=cfg.replay == "streams" and cfg.overlap > 0,
        # a carry per stream; with one group, row b is stream b (no ids needed)
        stream_key=STREAM if cfg.replay == "streams" and cfg.stream_groups > 1 else None,
    )
    updater = (HardUpdate(loss, value_network_update_interval=cfg.hard_update) if cfg.hard_update
               else SoftUpdate(loss, tau=cfg.tau))
    return loss, updater


def parse_args(argv=None) -> Config:
    cfg = options.cli(Config, __doc__, argv)
    options.or_fail(envs.check_keep, cfg)
    options.or_fail(check_actions, cfg)
    options.or_fail(report.check_run_folder, cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def main(cfg: Config) -> list[dict]:
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # not the storage's size at its first write
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    frames_per_batch, planned_frames = cfg.frames_per_batch, cfg.planned_frames
    out_dir = report.check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    qnet, rnn, policy = make_qnet(cfg, envs.make_env(cfg, warn=True))
    env = envs.make_acting_env(cfg, [rnn], cfg.seed)
    collector = envs.make_collector(cfg, env, policy.to(cfg.device), frames_per_batch, planned_frames)
    buffer = make_buffer(cfg)
    training = batches(cfg, buffer)
    loss_module, updater = make_loss(cfg, qnet, rnn)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr)
    log = report.Report(out_dir, planned_frames=planned_frames, target=cfg.target,
                        return_window=cfg.return_window, stop_at_target=cfg.stop_at_target,
                        progress=cfg.progress)
    learned_frames, grad_steps, recurrent_steps, learn_s = 0, 0, 0, 0.0
    last = {"loss": float("nan"), "td_error": float("nan")}
    for batch in collector:  # [num_envs, collect_len]
        torch.set_num_threads(cfg.threads)  # TorchRL's batched env raises it when it closes
        write(cfg, buffer, batch)
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
    log.close(cfg.name)
    return log.rows


if __name__ == "__main__":
    main(parse_args())
