"""The main job's Config: recurrent PPO's hyperparameters, one field per flag, each checked."""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import ClassVar, Literal

from . import options


RENAMED = {"--chunk-len": "--seq-len"}  # deprecated flags of the main jobs -> their spelling now


def uncovered_steps(rollout_len: int, window: int, stride: int) -> int:
    """Steps of each rollout row that no window ``[start, start + window)`` holds, with windows
    starting at ``0, stride, 2 * stride, ...`` while they fit (what ``make_windows`` cuts)."""
    starts = range(0, rollout_len - window + 1, stride)
    covered = set().union(*(range(s, s + window) for s in starts))
    return rollout_len - len(covered)


def env_name(env: str, keep: str) -> str:
    """The env as a run's folder names it: its id, and the kept observation entries where ``keep``
    is not ``"auto"`` (two runs of one env that observe other entries get other folders): their
    indices (``keep0,1``), or for a list of more than 32 characters their count and a digest."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", env)
    if keep == "auto":
        return name
    try:
        kept = "all" if keep == "all" else ",".join(str(int(i)) for i in keep.split(","))
    except ValueError:  # not indices: the name of a Config its check() refuses
        kept = re.sub(r"[^A-Za-z0-9_.,-]", "_", keep)
    if len(kept) > 32:
        kept = f"{kept.count(',') + 1}of{hashlib.sha1(kept.encode()).hexdigest()[:8]}"
    return f"{name}_keep{kept}"


@dataclasses.dataclass
class RunConfig:
    """What every recipe's run shares: the task, the run's size and seed, where it runs, what it
    reports and where it writes. Each recipe's Config adds its own fields (and defaults)."""
    env: str = "CartPole-v1"
    """gymnasium id, "module:Id" too (e.g. popgym:popgym-RepeatFirstEasy-v0)"""
    keep: str = "auto"
    """observation indices kept: "0,2", "all", or "auto" (envs.DEFAULT_KEEP)"""
    max_episode_steps: int = 0
    """truncate episodes after this many steps (gymnasium's TimeLimit); 0 keeps the env's own limit"""
    total_frames: int = 100_000
    """env frames of the run (the main job: also the length of its lr and clip schedules)"""
    seed: int = 0
    """seed of torch, the envs and the sampler"""
    device: str = "cpu"
    """torch device of the models and the collector"""
    threads: int = 1
    """torch intra-op threads; small models run fastest on one"""
    num_envs: int = 8
    """envs stepped by the collector"""
    env_batching: Literal["vector", "serial", "parallel"] = "vector"
    """how the envs are stepped: vector (one in-process gymnasium vector env, several times faster for cheap envs; the same run as serial, step for step), serial (TorchRL SerialEnv), parallel (ParallelEnv workers)"""
    name: str = ""
    """run directory name under --runs-dir; "" derives it from the options"""
    runs_dir: str = "runs"
    """folder of the run directories"""
    overwrite: bool = False
    """replace the outputs of a finished run of the same name"""
    obs_norm: bool = True
    """normalize observations by their running mean and std (VecNormV2's rule: RunningObservationNorm)"""
    reward_norm: bool = True
    """divide rewards by the running std of the discounted return (ReturnScaledReward)"""
    # reporting
    return_window: int = 20
    """episodes averaged in the reported mean return"""
    target_return: str = "auto"
    """mean return whose first frame is reported; "auto": 450 on CartPole-v1, none elsewhere"""
    stop_at_target: bool = False
    """end the run once the mean return reaches the target"""
    progress: bool = True
    """show a progress bar"""

    @property
    def target(self) -> float | None:
        """The target mean return, or None."""
        if self.target_return == "auto":  # the id less a "module:" prefix
            return 450.0 if self.env.rpartition(":")[2] == "CartPole-v1" else None
        return float(self.target_return)

    TARGET_FIX: ClassVar[str] = "set one with --target-return"
    """How a run without a target gets one (the refusal of --stop-at-target says it)."""

    APPLIES: ClassVar[dict[str, tuple[str | None, tuple | range, str]]] = {}
    """Options that apply only to some runs: field -> (the field it depends on, its values where the
    option applies, a note for the refusal); see ``options.applicable``."""

    def check_run(self) -> None:
        """The shared options against their meaning; a ValueError (TypeError) names the flag and the fix."""
        options.applicable(self)
        for name, low in {"max_episode_steps": 0, "total_frames": 1, "num_envs": 1, "return_window": 1}.items():
            options.integer(name, getattr(self, name), low)
        options.integer("seed", self.seed, 0, 2**64 - 1)  # torch.manual_seed's range
        options.integer("threads", self.threads, 1, os.cpu_count() or 1)  # more threads than CPUs only contend
        options.device("device", self.device)
        options.gym_id("env", self.env)
        if self.keep not in ("auto", "all"):
            options.int_list("keep", self.keep, low=0)
        if self.target_return != "auto":
            try:
                options.real("target_return", float(self.target_return))
            except ValueError:
                raise ValueError(f"--target-return must be a number or 'auto', got {self.target_return!r}") from None
        if self.stop_at_target and self.target is None:
            raise ValueError(f"--stop-at-target: --env {self.env} has no target to stop at; {self.TARGET_FIX}, "
                             "or drop --stop-at-target")
        if not self.runs_dir or "/" in self.name or self.name in (".", ".."):
            raise ValueError("--runs-dir must not be empty, and --name must be a folder name (no '/')")


@dataclasses.dataclass
class Config(RunConfig):
    """The main job's hyperparameters: recurrent PPO on windows or stream chunks."""
    # collection
    rollout_len: int = 32
    """steps per env per iteration; frames per iteration = num_envs * rollout_len"""
    # model
    hidden: int = 64
    """units of the encoder, the recurrent layer and the heads"""
    cell: Literal["gru", "lstm"] = "gru"
    """recurrent layer of the actor and of the critic"""
    rnn: Literal["resetrnn", "torchrl"] = "resetrnn"
    """recurrent module: ResetRNN over nn.GRU / nn.LSTM, or TorchRL's GRUModule / LSTMModule inside ResetRNN (TorchRL's keys; the same weights and results)"""
    encoder: bool = True
    """a Linear+Tanh layer before the recurrent layer"""
    activation: Literal["tanh", "relu"] = "tanh"
    """activation of the heads"""
    # PPO
    gamma: float = 0.99
    """discount, in [0, 1]"""
    lmbda: float = 0.8
    """GAE lambda, in [0, 1]"""
    lr: float = 1e-3
    """Adam learning rate, > 0"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over total_frames"""
    anneal_clip: bool = True
    """decay clip_epsilon linearly to 0 over total_frames"""
    obs_norm_until: float = 0.4
    """fraction of total_frames after which the observation statistics stop updating (frozen), in (0, 1]; 1: never. The learning rate anneals to 0, so late in a run the policy cannot follow statistics that still drift (what made runs slide after reaching 500)"""
    epochs: int = 10
    """passes over each rollout"""
    minibatches: int = 1
    """gradient steps per epoch (windows only; at most the windows per rollout)"""
    clip_epsilon: float = 0.2
    """PPO clip range, in (0, 1]"""
    entropy_coeff: float = 0.0
    """entropy bonus weight, >= 0"""
    critic_coeff: float = 0.5
    """value loss weight, >= 0"""
    max_grad_norm: float = 0.5
    """global gradient norm clip, > 0"""
    advantage_std_floor: float = 0.2
    """standardize each rollout's advantages by max(std, this floor), so that advantages near zero (nothing left to learn) are not blown up to unit scale; 0: by the std alone, per batch (per rollout with --batching streams)"""
    # batching
    batching: Literal["windows", "streams"] = "windows"
    """windows of each rollout, or stream chunks with a carried state"""
    boundary_mode: Literal["reset_continue", "mask", "inverse_count"] = "reset_continue"
    """windows only: what RecurrentPPOLoss does at episode starts"""
    window: int = 32
    """windows only: steps per window, <= rollout_len (= rollout_len: every step is unrolled once per epoch)"""
    stride: int = 32
    """windows only: steps between window starts; the windows must cover every step of the rollout"""
    num_streams: int = 8
    """streams only: B, streams per chunk"""
    seq_len: int = 32
    """streams only: T, steps per chunk (was --chunk-len)"""
    APPLIES: ClassVar[dict[str, tuple[str | None, tuple | range, str]]] = {
        "obs_norm_until": ("obs_norm", (True,), " (it freezes the observation statistics)"),
        "boundary_mode": ("batching", ("windows",), " (stream chunks carry the state)"),
        **{name: ("batching", ("windows",), "") for name in ("window", "stride", "minibatches")},
        **{name: ("batching", ("streams",), "") for name in ("num_streams", "seq_len")},
    }

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.default_name()

    def env_name(self) -> str:
        """The env as the run's folder names it (:func:`env_name`)."""
        return env_name(self.env, self.keep)

    def default_name(self) -> str:
        mode = self.boundary_mode if self.batching == "windows" else "streams"
        return f"{self.env_name()}_{mode}_seed{self.seed}"

    def check(self) -> None:
        """Every option against its meaning; a ValueError (TypeError for a wrong type) names the flag and the fix."""
        self.check_run()
        ints = {"rollout_len": 1, "hidden": 1, "epochs": 1, "minibatches": 1, "window": 1, "stride": 1,
                "num_streams": 1, "seq_len": 1}
        for name, low in ints.items():
            options.integer(name, getattr(self, name), low)
        for name in ("gamma", "lmbda"):
            options.real(name, getattr(self, name), 0.0, 1.0)
        options.real("lr", self.lr, 0.0, open_low=True)
        options.real("clip_epsilon", self.clip_epsilon, 0.0, 1.0, open_low=True)
        options.real("obs_norm_until", self.obs_norm_until, 0.0, 1.0, open_low=True)
        options.real("max_grad_norm", self.max_grad_norm, 0.0, open_low=True)
        for name in ("entropy_coeff", "critic_coeff", "advantage_std_floor"):
            options.real(name, getattr(self, name), 0.0)
        if self.num_envs * self.rollout_len < 2:  # the std of one advantage is NaN
            raise ValueError(f"--num-envs {self.num_envs} x --rollout-len {self.rollout_len} is one step per rollout: "
                             "the advantages are standardized over a rollout, which needs at least 2 steps")
        if self.batching == "streams":
            return
        if self.window > self.rollout_len:
            raise ValueError(f"--window {self.window} is longer than --rollout-len {self.rollout_len}: "
                             "give --window <= --rollout-len")
        lost = uncovered_steps(self.rollout_len, self.window, self.stride)
        if lost:
            raise ValueError(f"--window {self.window} --stride {self.stride} leave {lost} of every {self.rollout_len} "
                             "steps per env in no window (never trained): give a --stride <= --window that divides "
                             "--rollout-len minus --window")
        windows = self.num_envs * ((self.rollout_len - self.window) // self.stride + 1)
        if self.minibatches > windows:
            raise ValueError(f"--minibatches {self.minibatches} is more than the {windows} windows per rollout: "
                             f"give --minibatches <= {windows}")
