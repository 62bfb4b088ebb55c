"""Reverse curriculum from one demonstration on a sparse-reward task, trained with the main job's recurrent PPO.

Salimans & Chen (2018), "Learning Montezuma's Revenge from a Single Demonstration":
episodes start from states along the demo, first near its end; a shared ResetManager
moves the maximum starting point back as episodes reach the goal at least as well as
the demo, until the agent starts where the demo did. Then starting point 0 is the env's
own reset, so the agent trains on the task itself.

    seqchunk curriculum                                  # MountainCar-v0
    seqchunk curriculum --env MiniGrid-DoorKey-5x5-v0    # the minigrid extra
    seqchunk curriculum --env MiniGrid-DoorKey-8x8-v0 --eval-sample  # sampled evaluation
    seqchunk curriculum --no-curriculum                  # the same PPO from the env's reset

Demos: shipped with the package (torchrl_seqchunk/recipes/data/, recorded by the repository's
examples/record_demos.py); --demo takes any file written by Demo.save for --env. Every
--eval-every iterations, --eval-episodes episodes from the env's own reset (starting point 0,
no curriculum) measure the true task. Writes runs/<name>/metrics.csv (per iteration: frames, the maximum starting point,
the success rate of the training episodes, the evaluation's mean return and success
rate; then the main job's columns) and, beside it, learning_curve.png (training episodes)
and curriculum.png (the maximum starting point and the evaluation against frames).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import ClassVar, Literal

import gymnasium as gym
import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, ParallelEnv, RewardSum, SerialEnv, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_seqchunk import (Demo, EncodeObservation, ResetManager, ReturnScaledReward, ReverseCurriculum,
                              RunningObservationNorm)

from .common import options
from .common.agent import make_agent
from .common.batching import make_batching
from .common.config import Config as MainConfig
from .common.ppo import LOGGED, learn
from .common.report import Report, Run, check_run_folder, finished_returns

__all__ = ["TASKS", "Config", "Run", "check_command", "train"]

DATA = Path(__file__).resolve().parent / "data"  # the demos ship with the package (package data)
CURRICULUM_PNG = "curriculum.png"  # the march and the evaluation, beside the main job's outputs
#: env id -> (shipped demo, the evaluation's target: ("return", mean) or ("success", rate),
#: the default --margin: 20 steps slower than the demo)
TASKS = {
    "MountainCar-v0": (DATA / "mountain_car_demo.npz", ("return", -110.0), 20.0),
    "MiniGrid-DoorKey-5x5-v0": (DATA / "minigrid_doorkey_demo.npz", ("success", 0.9), 0.072),
    # MiniGrid pays 1 - 0.9 * steps / max_steps at the goal, max_steps 640 on the 8x8 grid
    "MiniGrid-DoorKey-8x8-v0": (DATA / "minigrid_doorkey8_demo.npz", ("success", 0.9), 0.9 * 20 / 640),
}


@dataclasses.dataclass
class Config(MainConfig):
    """The curriculum recipe's options: the main job's recurrent PPO (its fields and checks),
    the task and its demo, the ResetManager's and the evaluation's; ``check()`` also loads the
    demo. A ValueError names the field (as its flag) and the fix."""
    env: str = "MountainCar-v0"
    """gymnasium id; demos ship for MountainCar-v0 and MiniGrid-DoorKey-5x5-v0 / -8x8-v0 (the minigrid extra)"""
    env_batching: Literal["serial", "parallel"] = "serial"
    """serial (TorchRL SerialEnv) or parallel (ParallelEnv workers): each env restores demo states of its own"""
    demo: str = ""
    """demo file (Demo.save format) recorded in --env; "" takes the shipped one"""
    curriculum: bool = True
    """start episodes along the demo (--no-curriculum: the same PPO from the env's reset)"""
    total_frames: int = 200_000
    """training env frames of the run (evaluation frames not counted); also the lr schedule's length"""
    num_envs: int = 16
    """envs stepped by the collector, sharing the ResetManager"""
    spread: int = 0
    """ResetManager window: demo steps the envs' starting points span below the maximum; 0: min(16, half the demo)"""
    move_threshold: float = 0.1
    """ResetManager: success mass (x spread) that moves the maximum back, in (0, 1]"""
    nudge: int = 4
    """ResetManager: demo steps the maximum moves forward when success collapses"""
    margin: float = -1.0
    """score an episode may trail the demo and still succeed, >= 0; -1: the task's default (20 steps)"""
    APPLIES: ClassVar[dict[str, tuple[str | None, tuple | range, str]]] = {
        **MainConfig.APPLIES,
        **{name: ("curriculum", (True,), " (the curriculum's ResetManager and success rule)")
           for name in ("spread", "move_threshold", "nudge", "margin")},
        "demo": ("curriculum", (True,), " (PPO from the env's reset starts no episode along a demo)"),
        **{name: (None, (), " (the demo is replayed in the env as registered, and the targets are the "
                            "evaluation's, TASKS)") for name in ("keep", "max_episode_steps", "target_return")},
    }
    gamma: float = 0.99
    """discount, in [0, 1]"""
    lmbda: float = 0.95
    """GAE lambda, in [0, 1]"""
    epochs: int = 4
    """passes over each rollout"""
    advantage_std_floor: float = 0.0
    """standardize each rollout's advantages by max(std, this floor); 0: by the std alone, per batch"""
    entropy_coeff: float = 0.01
    """entropy bonus weight, >= 0"""
    anneal_clip: bool = False
    """decay clip_epsilon linearly to 0 over total_frames"""
    obs_norm_until: float = 1.0
    """fraction of total_frames after which the observation statistics stop updating (frozen), in (0, 1]; 1: never (the moving starting points keep changing what the envs show)"""
    eval_every: int = 8
    """iterations between evaluations from the env's own reset"""
    eval_episodes: int = 8
    """episodes per evaluation, one per env (greedy actions unless --eval-sample)"""
    eval_sample: bool = False
    """evaluate with actions drawn from the policy (TorchRL's RANDOM interaction) instead of greedy
    ones: a greedy policy that sees part of a MiniGrid can loop where the policy it was trained as gets out"""

    @property
    def target(self) -> float | None:
        """The evaluation's target (TASKS: a mean return or a goal rate), where --stop-at-target
        stops; None for an env without one."""
        return TASKS[self.env][1][1] if self.env in TASKS else None

    TARGET_FIX: ClassVar[str] = f"this recipe's targets are its tasks' ({', '.join(TASKS)})"

    def default_name(self) -> str:
        arm = "curriculum" if self.curriculum else "scratch"
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.env)}_{arm}_seed{self.seed}"

    def check(self) -> None:
        """The main job's checks, then the curriculum's; a ValueError names the flag and the fix."""
        if self.env.startswith("MiniGrid"):
            try:
                import minigrid  # noqa: F401  (registers the MiniGrid ids)
            except ModuleNotFoundError:
                raise ValueError(f"--env {self.env} needs the minigrid extra: pip install 'torchrl-seqchunk[minigrid]' "
                                 "(in a checkout: pip install -e '.[minigrid]')") from None
        super().check()
        for name, low in {"spread": 0, "nudge": 1, "eval_every": 1, "eval_episodes": 1}.items():
            options.integer(name, getattr(self, name), low)
        options.real("move_threshold", self.move_threshold, 0.0, 1.0, open_low=True)
        if self.margin != -1.0:
            options.real("margin", self.margin, 0.0)
        if not self.curriculum:
            return
        if not self.demo and self.env not in TASKS:
            raise ValueError(f"--env {self.env} ships no demo; pass --demo, or one of {', '.join(TASKS)}")
        try:
            demo = self.load_demo()
        except ValueError as err:
            raise ValueError(f"--demo: {err}") from None
        recorded = demo.meta.get("env_spec", {}).get("id", self.env)
        if recorded != self.env:
            raise ValueError(f"--demo {self.demo_path} was recorded in {recorded}, not in --env {self.env}")
        self.make_manager(demo)

    def make_manager(self, demo: Demo) -> ResetManager:
        """The curriculum's ResetManager over ``demo``; a ValueError names the flags (--spread is its window)."""
        window = self.spread or max(1, min(16, len(demo) // 2))
        try:
            return ResetManager(len(demo), self.num_envs, window=window, move_threshold=self.move_threshold,
                                nudge=self.nudge)
        except ValueError as err:
            raise ValueError(f"--spread {window} (the window), --move-threshold {self.move_threshold}, --num-envs "
                             f"{self.num_envs}: {err}") from None

    @property
    def demo_path(self) -> str:
        return self.demo or str(TASKS[self.env][0])

    @property
    def success_margin(self) -> float:
        return TASKS[self.env][2] if self.margin == -1.0 else self.margin

    def load_demo(self) -> Demo:
        return Demo.load(self.demo_path)


def check_command(cfg: Config) -> Config:
    """The checks of a command line beyond ``cfg.check()`` (which loads the demo): the run
    folder (a finished run is kept unless ``--overwrite``). Returns ``cfg``; a ValueError names
    the flag and the fix."""
    check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    return cfg


def make_task(env_id: str) -> gym.Env:
    """The gymnasium env with one flat float observation (MiniGrid: its 7x7 egocentric view)."""
    if env_id.startswith("MiniGrid"):
        import minigrid  # noqa: F401  (registers the ids)
        from minigrid.wrappers import ImgObsWrapper

        return EncodeObservation(ImgObsWrapper(gym.make(env_id)))
    env = gym.make(env_id)
    flat = isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1
    return env if flat else EncodeObservation(env)


def episode_limit(env_id: str) -> int:
    """Steps after which the env truncates an episode."""
    env = make_task(env_id)
    return env.spec.max_episode_steps or env.unwrapped.max_steps


def make_worker(env_id: str, demo: Demo | None, margin: float | None) -> TransformedEnv | GymWrapper:
    """One env; with a demo it restores starting points (and 0 is the env's own reset), its
    success ``margin`` behind the demo's score (unread without a demo)."""
    env = GymWrapper(make_task(env_id))
    if demo is None:
        return env
    return TransformedEnv(env, ReverseCurriculum(demo, restore="replay", success="goal", margin=margin,
                                                 env_reset_at_zero=True))


def make_env(cfg: Config, demo: Demo | None, manager: ResetManager | None, num_envs: int, seed: int,
             transforms=()) -> TransformedEnv:
    """``num_envs`` workers in one SerialEnv; the curriculum's assigning role on top, then the main
    job's transforms (is_first, the raw return, and ``transforms``)."""
    margin = None if demo is None else cfg.success_margin  # an env without a shipped demo has no default
    factory = functools.partial(make_worker, cfg.env, demo, margin)  # picklable for workers
    batched = (ParallelEnv if cfg.env_batching == "parallel" else SerialEnv)(num_envs, factory)
    top = [ReverseCurriculum(demo, manager, success="goal", margin=margin)] if manager else []
    env = TransformedEnv(batched, Compose(*top, InitTracker(init_key="is_first"), RewardSum(), *transforms))
    env.set_seed(seed)
    return env


def evaluate(cfg: Config, actor, rnns, obs_norm: RunningObservationNorm | None, index: int) -> tuple[float, float]:
    """Mean return and goal rate of ``eval_episodes`` episodes from the env's own reset, greedy
    (or drawn from the policy with ``eval_sample``)."""
    env = make_env(cfg, None, None, cfg.eval_episodes, 10_000 + 1_000 * cfg.seed + index,
                   transforms=[t for t in (obs_norm, *(rnn.make_tensordict_primer() for rnn in rnns)) if t is not None])
    mode = ExplorationType.RANDOM if cfg.eval_sample else ExplorationType.DETERMINISTIC
    with torch.no_grad(), set_exploration_type(mode):
        # one episode per env: a done env stops stepping, the rollout ends when all are done
        steps = env.rollout(episode_limit(cfg.env), actor, break_when_any_done=False, break_when_all_done=True,
                            auto_cast_to_device=True)  # [episodes, <= limit]
    env.close()
    done = steps["next", "done"].squeeze(-1)
    first = done.long().argmax(-1)  # the end of each env's first episode (a time limit at the latest)
    rows = torch.arange(done.shape[0])
    returns = steps["next", "episode_reward"].squeeze(-1)[rows, first]
    goals = steps["next", "terminated"].squeeze(-1)[rows, first]
    return returns.mean().item(), goals.float().mean().item()


def met(cfg: Config, eval_return: float, eval_success: float) -> bool:
    """Whether an evaluation meets the task's target (``cfg.target``); False for tasks without one."""
    if cfg.target is None:
        return False
    return (eval_return if TASKS[cfg.env][1][0] == "return" else eval_success) >= cfg.target


def plot(rows: list[dict], path: Path, cfg: Config) -> None:
    """The maximum starting point and the evaluation from the env's reset, against frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, target = TASKS[cfg.env][1] if cfg.env in TASKS else ("return", None)
    evaluated = [r for r in rows if not math.isnan(r["eval_return"])]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(6, 5))
    top.plot([r["frames"] for r in rows], [r["max_starting_point"] for r in rows])
    top.set(ylabel="maximum starting point", title=cfg.name)
    bottom.plot([r["frames"] for r in evaluated], [r[f"eval_{kind}"] for r in evaluated], marker=".")
    if target is not None:
        bottom.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
        bottom.legend(loc="upper left")
    bottom.set(xlabel="training frames", ylabel=f"evaluation {kind}, env's reset")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(cfg: Config) -> Run:
    """Trains the main job's recurrent PPO with (or, ``curriculum=False``, without) the reverse
    curriculum, writing ``<runs_dir>/<name>/``; returns the Run (metrics rows per iteration:
    frames, wall_s, episodes, return_mean, max_starting_point, success_rate, eval_return,
    eval_success, then the PPO losses; files: metrics.csv, learning_curve.png, curriculum.png).
    A ValueError names the option and the fix.

    Examples:
        >>> from torchrl_seqchunk.recipes import curriculum
        >>> cfg = curriculum.Config()  # MountainCar-v0 from its shipped demo
        >>> cfg.name, cfg.demo_path.endswith("mountain_car_demo.npz")
        ('MountainCar-v0_curriculum_seed0', True)
    """
    cfg.check()  # a Config built in code is checked as a command line is
    out_dir = check_run_folder(cfg.runs_dir, cfg.name, cfg.overwrite)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    demo = cfg.load_demo() if cfg.curriculum else None
    manager = cfg.make_manager(demo) if cfg.curriculum else None
    # VecNormV2's rule, one set of statistics over all envs, its values clipped to +-10: a MiniGrid
    # cell constant over the demo's layout sits at the std floor, and a new layout's value there
    # would come out at 1e4 (the evaluation, which starts from new layouts, reads a frozen copy)
    obs_norm = RunningObservationNorm(clip=10.0) if cfg.obs_norm else None
    reward_norm = ReturnScaledReward(gamma=cfg.gamma) if cfg.reward_norm else None
    transforms = [t for t in (obs_norm, reward_norm) if t is not None]
    env = make_env(cfg, demo, manager, cfg.num_envs, cfg.seed, transforms=transforms)
    actor, critic, rnns = make_agent(cfg, env, carry=cfg.batching == "streams")
    env.append_transform(Compose(*(rnn.make_tensordict_primer() for rnn in rnns)))
    actor, critic = actor.to(cfg.device), critic.to(cfg.device)
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    planned = -(-cfg.total_frames // frames_per_batch) * frames_per_batch  # whole rollouts
    collector = Collector(env, TensorDictSequential(actor, critic), frames_per_batch=frames_per_batch,
                          total_frames=planned, device=cfg.device, auto_register_policy_transforms=False)
    batching = make_batching(cfg, rnns, frames_per_batch)
    loss_module = batching.make_loss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)
    report = Report(out_dir, planned_frames=planned, return_window=cfg.return_window, progress=cfg.progress,
                    outputs=(CURRICULUM_PNG,))
    for iteration, rollout in enumerate(collector):  # [num_envs, T]
        torch.set_num_threads(cfg.threads)
        ended = rollout["next", "done"].squeeze(-1)
        returns = finished_returns(rollout)
        remaining = max(0.0, 1 - (report.frames + rollout.numel()) / planned)  # of the lr and clip schedules
        losses = learn(cfg, rollout, critic, batching, loss_module, optim, remaining=remaining, obs_norm=obs_norm)
        collector.update_policy_weights_()
        evaluation = (math.nan, math.nan)
        if (iteration + 1) % cfg.eval_every == 0:
            evaluation = evaluate(cfg, actor, rnns, None if obs_norm is None else obs_norm.frozen_copy(), iteration)
        success = (rollout["next", "success"][ended].float().mean().item()
                   if manager is not None and ended.any() else math.nan)
        report.add(rollout.numel(), returns, {
            "max_starting_point": manager.maximum if manager is not None else 0, "success_rate": success,
            "eval_return": evaluation[0], "eval_success": evaluation[1], **{k: losses[k] for k in LOGGED}})
        if cfg.stop_at_target and met(cfg, *evaluation) and (manager is None or manager.maximum == 0):
            break
    collector.shutdown()
    run = report.close(cfg.name)
    plot(report.rows, out_dir / CURRICULUM_PNG, cfg)
    return dataclasses.replace(run, files=(*run.files, out_dir / CURRICULUM_PNG))
