"""Reverse curriculum from one demonstration on a sparse-reward task, trained with the main job's recurrent PPO.

Salimans & Chen (2018), "Learning Montezuma's Revenge from a Single Demonstration":
episodes start from states along the demo, first near its end; a shared ResetManager
moves the maximum starting point back as episodes reach the goal at least as well as
the demo, until the agent starts where the demo did. Then starting point 0 is the env's
own reset, so the agent trains on the task itself.

    python examples/reverse_curriculum.py                                  # MountainCar-v0
    python examples/reverse_curriculum.py --env MiniGrid-DoorKey-5x5-v0    # the minigrid extra
    python examples/reverse_curriculum.py --no-curriculum                  # the same PPO from the env's reset

Demos: examples/data/ (recorded by examples/data/record_demos.py); --demo takes any
file written by Demo.save for --env. Every --eval-every iterations, --eval-episodes
episodes from the env's own reset (starting point 0, no curriculum) measure the true
task. Writes runs/<name>/metrics.csv (per iteration: frames, the maximum starting point,
the success rate of the training episodes, the evaluation's mean return and success
rate) and runs/<name>/curriculum.png.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import re
import time
from pathlib import Path

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, RewardSum, SerialEnv, TransformedEnv, VecNormV2
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator
from tqdm import tqdm

from torchrl_seqchunk import (
    Demo,
    EncodeObservation,
    RecurrentPPOLoss,
    ResetManager,
    ResetRNN,
    ReturnScaledReward,
    ReverseCurriculum,
    boundary_gae,
    make_windows,
)

from torchrl_seqchunk._checks import check_int, check_real

from cli import config_parser, opt  # examples/cli.py

DATA = Path(__file__).resolve().parent / "data"
#: env id -> (shipped demo, the evaluation's target: ("return", mean) or ("success", rate),
#: the default --margin: 20 steps slower than the demo)
TASKS = {
    "MountainCar-v0": (DATA / "mountain_car_demo.npz", ("return", -110.0), 20.0),
    "MiniGrid-DoorKey-5x5-v0": (DATA / "minigrid_doorkey_demo.npz", ("success", 0.9), 0.072),
}


@dataclasses.dataclass
class Config:
    env: str = opt("MountainCar-v0", f"gymnasium id; demos ship for {', '.join(TASKS)}")
    demo: str = opt("", 'demo file (Demo.save format) recorded in --env; "" takes the shipped one')
    curriculum: bool = opt(True, "start episodes along the demo (--no-curriculum: PPO from the env's reset)")
    total_frames: int = opt(200_000, "training env frames of the run (evaluation frames not counted)")
    seed: int = opt(0, "seed of torch and the envs")
    num_envs: int = opt(16, "envs stepped by the collector (and envs sharing the ResetManager)")
    rollout_len: int = opt(32, "T: steps per env per iteration; also the PPO window")
    name: str = opt("", 'run directory name under --runs-dir; "" derives it from the options')
    runs_dir: str = opt("runs", "folder of the run directories")
    overwrite: bool = opt(False, "replace the outputs of a finished run of the same name")
    progress: bool = opt(True, "show a progress bar")
    # curriculum
    spread: int = opt(0, "ResetManager window: demo steps the envs' starting points span below the maximum; 0: min(16, half the demo)")
    margin: float = opt(-1.0, "score an episode may trail the demo and still succeed; -1: the task's default (20 steps)")
    move_threshold: float = opt(0.1, "ResetManager: success mass (x spread) that moves the maximum back")
    nudge: int = opt(4, "ResetManager: demo steps the maximum moves forward when success collapses")
    # PPO (the main job's)
    hidden: int = opt(64, "units of the encoder, the GRU and the heads")
    gamma: float = opt(0.99, "discount")
    lmbda: float = opt(0.95, "GAE lambda")
    lr: float = opt(1e-3, "Adam learning rate, decayed linearly to 0 over total_frames")
    epochs: int = opt(4, "passes over each rollout")
    clip_epsilon: float = opt(0.2, "PPO clip range")
    entropy_coeff: float = opt(0.01, "entropy bonus weight")
    max_grad_norm: float = opt(0.5, "global gradient norm clip")
    # evaluation from the env's own reset
    eval_every: int = opt(8, "iterations between evaluations")
    eval_episodes: int = opt(8, "episodes per evaluation, one per env, greedy actions")
    stop_at_target: bool = opt(False, "end the run once the evaluation meets the task's target")


def make_agent(cfg: Config, env):
    """Actor and critic, each an MLP encoder -> ResetRNN(GRU) -> head (discrete actions)."""
    obs_dim = env.observation_spec["observation"].shape[-1]
    action_spec = env.full_action_spec_unbatched["action"]

    def trunk(prefix):
        rnn = ResetRNN(nn.GRU(cfg.hidden, cfg.hidden, batch_first=True), in_key=f"{prefix}_embed",
                       out_key=f"{prefix}_features", state_key=f"{prefix}_state", reset_state_key=f"{prefix}_state")
        encoder = TensorDictModule(nn.Sequential(nn.Linear(obs_dim, cfg.hidden), nn.Tanh()),
                                   in_keys=["observation"], out_keys=[f"{prefix}_embed"])
        return TensorDictSequential(encoder, rnn), rnn

    actor_trunk, actor_rnn = trunk("actor")
    critic_trunk, critic_rnn = trunk("critic")
    head = TensorDictModule(MLP(in_features=cfg.hidden, out_features=action_spec.shape[-1], num_cells=[cfg.hidden],
                                activation_class=nn.Tanh), in_keys=["actor_features"], out_keys=["logits"])
    actor = ProbabilisticActor(TensorDictSequential(actor_trunk, head), in_keys=["logits"], spec=action_spec,
                               distribution_class=OneHotCategorical, return_log_prob=True)
    critic = TensorDictSequential(critic_trunk, ValueOperator(
        MLP(in_features=cfg.hidden, out_features=1, num_cells=[cfg.hidden], activation_class=nn.Tanh),
        in_keys=["critic_features"]))
    return actor, critic, (actor_rnn, critic_rnn)


class Report:
    """metrics.csv (one row per iteration) and curriculum.png under runs/<name>."""

    def __init__(self, cfg: Config, planned: int):
        self.out = Path(cfg.runs_dir) / cfg.name
        if (self.out / "metrics.csv").exists() and not cfg.overwrite:
            raise SystemExit(f"{self.out} holds an earlier run; pass --name or --overwrite.")
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows, self.frames, self.start = [], 0, time.perf_counter()
        self.bar = tqdm(total=planned, unit="frames", disable=not cfg.progress)

    def add(self, frames: int, values: dict) -> None:
        self.frames += frames
        self.rows.append({"frames": self.frames, "wall_s": round(time.perf_counter() - self.start, 2), **values})
        with open(self.out / "metrics.csv", "a" if len(self.rows) > 1 else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            if len(self.rows) == 1:
                writer.writeheader()
            writer.writerow(self.rows[-1])
        self.bar.set_postfix(start=values["max_starting_point"], ret=f"{values['eval_return']:.1f}", refresh=False)
        self.bar.update(frames)

    def close(self) -> None:
        self.bar.close()


#: the range of every numeric option (check_int / check_real bounds)
RANGES = {
    "total_frames": {"low": 1}, "seed": {"low": 0}, "num_envs": {"low": 1}, "rollout_len": {"low": 1},
    "spread": {"low": 0}, "move_threshold": {"low": 0.0, "high": 1.0, "open_low": True}, "nudge": {"low": 1},
    "hidden": {"low": 1}, "gamma": {"low": 0.0, "high": 1.0, "open_low": True}, "lmbda": {"low": 0.0, "high": 1.0},
    "lr": {"low": 0.0, "open_low": True}, "epochs": {"low": 1}, "clip_epsilon": {"low": 0.0, "high": 1.0, "open_low": True},
    "entropy_coeff": {"low": 0.0}, "max_grad_norm": {"low": 0.0, "open_low": True}, "eval_every": {"low": 1},
    "eval_episodes": {"low": 1},
}


def parse_args(argv=None) -> Config:
    """The Config of the command line; every option is checked here, before any output is touched."""
    parser = config_parser(Config, __doc__)
    cfg = Config(**vars(parser.parse_args(argv)))
    for name, bounds in RANGES.items():
        check = check_int if isinstance(getattr(Config, name), int) else check_real
        try:
            check("--" + name.replace("_", "-"), getattr(cfg, name), **bounds)
        except (TypeError, ValueError) as err:
            parser.error(str(err))
    if cfg.margin < 0 and cfg.margin != -1.0:
        parser.error(f"--margin must be >= 0, or -1 for the task's default, got {cfg.margin}")
    try:
        make_task(cfg.env)
    except (gym.error.Error, ImportError) as err:
        parser.error(f"--env {cfg.env} cannot be made: {err}")
    if not cfg.demo:
        if cfg.env not in TASKS:
            parser.error(f"--env {cfg.env} ships no demo; pass --demo, or one of {', '.join(TASKS)}")
        cfg.demo = str(TASKS[cfg.env][0])
    try:
        recorded = Demo.load(cfg.demo).meta.get("env_spec", {}).get("id", cfg.env)
    except ValueError as err:
        parser.error(f"--demo: {err}")
    if recorded != cfg.env:
        parser.error(f"--demo {cfg.demo} was recorded in {recorded}, not in --env {cfg.env}")
    if cfg.margin == -1.0:
        cfg.margin = TASKS[cfg.env][2] if cfg.env in TASKS else 0.0
    if not cfg.name:
        arm = "curriculum" if cfg.curriculum else "scratch"
        cfg.name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', cfg.env)}_{arm}_seed{cfg.seed}"
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


def make_worker(env_id: str, demo: Demo | None, margin: float) -> TransformedEnv | GymWrapper:
    """One env; with a demo it restores starting points (and 0 is the env's own reset)."""
    env = GymWrapper(make_task(env_id))
    if demo is None:
        return env
    return TransformedEnv(env, ReverseCurriculum(demo, restore="replay", success="goal", margin=margin,
                                                 env_reset_at_zero=True))


def make_env(cfg: Config, demo: Demo | None, manager: ResetManager | None, num_envs: int, seed: int,
             transforms=()) -> TransformedEnv:
    """``num_envs`` workers in one SerialEnv; the curriculum's assigning role on top, then the main
    job's transforms (is_first, the raw return, and ``transforms``)."""
    batched = SerialEnv(num_envs, functools.partial(make_worker, cfg.env, demo, cfg.margin))
    top = [ReverseCurriculum(demo, manager, success="goal", margin=cfg.margin)] if manager is not None else []
    env = TransformedEnv(batched, Compose(*top, InitTracker(init_key="is_first"), RewardSum(), *transforms))
    env.set_seed(seed)
    return env


def evaluate(cfg: Config, actor, rnns, obs_norm, index: int) -> tuple[float, float]:
    """Mean return and goal rate of ``eval_episodes`` episodes from the env's own reset, greedy."""
    limit = episode_limit(cfg.env)
    env = make_env(cfg, None, None, cfg.eval_episodes, 10_000 + 1_000 * cfg.seed + index,
                   transforms=[obs_norm, *(rnn.make_tensordict_primer() for rnn in rnns)])
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        # one episode per env: a done env stops stepping, the rollout ends when all are done
        steps = env.rollout(limit, actor, break_when_any_done=False, break_when_all_done=True)  # [episodes, <= limit]
    env.close()
    done = steps["next", "done"].squeeze(-1)
    first = done.long().argmax(-1)  # the end of each env's first episode (a time limit at the latest)
    rows = torch.arange(done.shape[0])
    returns = steps["next", "episode_reward"].squeeze(-1)[rows, first]
    goals = steps["next", "terminated"].squeeze(-1)[rows, first]
    return returns.mean().item(), goals.float().mean().item()


def met(cfg: Config, eval_return: float, eval_success: float) -> bool:
    """Whether an evaluation meets the task's target (TASKS); False for tasks without one."""
    kind, value = TASKS.get(cfg.env, (None, (None, None), None))[1]
    return kind is not None and (eval_return if kind == "return" else eval_success) >= value


def main(cfg: Config) -> list[dict]:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    demo = Demo.load(cfg.demo)
    spread = cfg.spread or max(1, min(16, len(demo) // 2))
    manager = (ResetManager(len(demo), cfg.num_envs, window=spread, move_threshold=cfg.move_threshold,
                            nudge=cfg.nudge) if cfg.curriculum else None)
    vecnorm = VecNormV2(in_keys=["observation"], decay=1.0, reduce_batch_dims=True)
    env = make_env(cfg, demo if cfg.curriculum else None, manager, cfg.num_envs, cfg.seed,
                   transforms=[vecnorm, ReturnScaledReward(gamma=cfg.gamma)])
    actor, critic, rnns = make_agent(cfg, env)
    env.append_transform(Compose(*(rnn.make_tensordict_primer() for rnn in rnns)))
    frames_per_batch = cfg.num_envs * cfg.rollout_len
    planned = -(-cfg.total_frames // frames_per_batch) * frames_per_batch
    collector = Collector(env, TensorDictSequential(actor, critic), frames_per_batch=frames_per_batch,
                          total_frames=planned, auto_register_policy_transforms=False)
    loss_module = RecurrentPPOLoss(actor, critic, boundary_mode="reset_continue", clip_epsilon=cfg.clip_epsilon,
                                   entropy_coeff=cfg.entropy_coeff, critic_coeff=0.5, loss_critic_type="l2",
                                   normalize_advantage=True)
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)
    memory_keys = [k for rnn in rnns for k in rnn.state_keys]
    report = Report(cfg, planned)
    for iteration, rollout in enumerate(collector):  # [num_envs, T]
        torch.set_num_threads(1)
        ended = rollout["next", "done"].squeeze(-1)
        with torch.no_grad():
            rollout["next", "state_value"] = critic(rollout["next"].reshape(-1))["state_value"].view(*rollout.shape, 1)
        boundary_gae(rollout, gamma=cfg.gamma, lmbda=cfg.lmbda)
        windows = make_windows(rollout, cfg.rollout_len, stride=cfg.rollout_len, memory_key=memory_keys)
        for _ in range(cfg.epochs):
            loss = loss_module(windows)
            optim.zero_grad()
            (loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]).backward()
            torch.nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.max_grad_norm)
            optim.step()
        collector.update_policy_weights_()
        for group in optim.param_groups:
            group["lr"] = cfg.lr * max(0.0, 1 - (report.frames + rollout.numel()) / planned)
        evaluation = (float("nan"), float("nan"))
        if (iteration + 1) % cfg.eval_every == 0:
            evaluation = evaluate(cfg, actor, rnns, vecnorm.to_observation_norm(), iteration)
        success = rollout["next", "success"][ended].float().mean().item() if cfg.curriculum and ended.any() else float("nan")
        report.add(rollout.numel(), {
            "max_starting_point": manager.maximum if manager is not None else 0,
            "episodes": int(ended.sum()),
            "success_rate": success,
            "eval_return": evaluation[0],
            "eval_success": evaluation[1],
        })
        if cfg.stop_at_target and met(cfg, *evaluation) and (manager is None or manager.maximum == 0):
            break
    collector.shutdown()
    report.close()
    return report.rows


if __name__ == "__main__":
    main(parse_args())
