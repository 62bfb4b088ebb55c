"""Reverse curriculum on Montezuma's Revenge from one human demonstration, trained with PPO.

Salimans & Chen (2018), "Learning Montezuma's Revenge from a Single Demonstration":
episodes start from states along the demo, first near its end; the shared
ResetManager moves the maximum starting point backward once enough episodes
finish at least as well as the demo (71,500 points).

    python examples/reverse_curriculum.py --total-frames 200000 --num-envs 8 --out runs/mr

Writes ``<out>/log.csv`` (one row per collected batch) and ``<out>/curriculum.png``
(maximum starting point and success rate over wall-clock time).

Measured on a 2-core CPU shared with other jobs (about 115 agent steps/s, 8 envs):
the maximum leaves the demo's end (frame 53,056) at once, crosses the stretch
after the last reward (frame 52,536) within the first half minute, then moves
back as the policy learns to reach that reward: to 52,426 after 7.4 min (50k
steps, seed 0) and to 52,406 after 14.2 min (100k steps, seed 1).

Pipeline: ParallelEnv workers each hold an ALE env (frame skip 4, no sticky
actions, grayscale) with a restoring ReverseCurriculum first (it needs raw
frames and raw rewards), then 84x84 resizing, 4-frame stacking and reward
signs. The assigning ReverseCurriculum with the ResetManager sits on top of the
ParallelEnv, in this process. A feed-forward CNN actor-critic is trained with
TorchRL's ClipPPOLoss and GAE.
"""
from __future__ import annotations

import csv
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import matplotlib
import numpy as np
import torch
import torch.nn.functional as F

from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import (
    Bounded,
    LazyTensorStorage,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
)
from torchrl.envs import (
    CatFrames,
    Compose,
    GymEnv,
    ObservationTransform,
    ParallelEnv,
    SignTransform,
    TransformedEnv,
)
from torchrl.modules import (
    ActorValueOperator,
    OneHotCategorical,
    ProbabilisticActor,
    ValueOperator,
)
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE
from tqdm import tqdm

from torchrl_seqchunk import Demo, ResetManager, ReverseCurriculum, record_demo

from cli import config_parser, opt  # examples/cli.py

try:
    import ale_py
except ModuleNotFoundError as err:  # the Atari games come with the optional extra
    raise SystemExit('this example needs ale-py: pip install -e ".[atari]"') from err

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DEMO_PATH = Path(__file__).resolve().parent / "data" / "montezuma_revenge_demo.npz"
ENV_ID = "ALE/MontezumaRevenge-v5"
FRAME_SKIP = 4


@dataclass
class Config:
    total_frames: int = opt(200_000, "agent steps of the run (x4 emulator frames)")
    num_envs: int = opt(8, "ParallelEnv workers, one ALE env each")
    seed: int = opt(0, "seed of torch and the envs")
    out: str = opt("runs/reverse_curriculum", "folder of log.csv, curriculum.png and the snapshot cache")
    device: str = opt("cpu", "torch device of the model")
    steps_per_env: int = opt(64, "rollout length per env and batch")
    epochs: int = opt(3, "PPO passes over each batch")
    minibatch: int = opt(256, "PPO minibatch size")
    lr: float = opt(2.5e-4, "Adam learning rate")
    gamma: float = opt(0.99, "discount")
    lmbda: float = opt(0.95, "GAE lambda")
    clip: float = opt(0.1, "PPO clip range")
    entropy: float = opt(0.01, "entropy bonus weight")
    spacing: int = opt(5, "ResetManager window = spacing * num_envs demo frames below the maximum")
    move_threshold: float = opt(0.1, "ResetManager: success mass (x window) that moves the maximum back")
    nudge: int = opt(100, "ResetManager: frames the maximum moves forward when success collapses")
    max_lag: int = opt(100, "emulator frames an episode may trail the demo's score")
    snapshot_every: int = opt(100, "emulator frames between cached ALE states")


def demo_with_snapshots(cfg: Config) -> Demo:
    """The shared demo plus ALE snapshots, so workers restore in <= snapshot_every frames."""
    cache = Path(cfg.out) / f"demo_snapshots_{cfg.snapshot_every}.npz"
    if cache.exists():
        return Demo.load(cache)
    demo = Demo.load(DEMO_PATH)
    env = gym.make(ENV_ID, frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    print(f"replaying the {len(demo)}-frame demo once to record snapshots ...")
    replay = record_demo(env, demo.actions, seed=demo.seed, snapshot_every=cfg.snapshot_every)
    if not np.array_equal(replay.rewards, demo.rewards):
        step = int(np.flatnonzero(replay.rewards != demo.rewards)[0])
        raise RuntimeError(f"the demo does not replay in this ale-py: rewards differ at frame {step}")
    demo = Demo(demo.actions, demo.rewards, snapshots=replay.snapshots, lives=demo.lives, meta=demo.meta)
    demo.save(cache)
    return demo


class Downsample(ObservationTransform):
    """uint8 grayscale frames [H, W] -> [1, size, size] by area averaging (torchvision-free resize)."""

    def __init__(self, size: int = 84):
        super().__init__(in_keys=["observation"], out_keys=["observation"])
        self.size = size

    def _apply_transform(self, frame: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(frame.reshape(-1, 1, *frame.shape[-2:]).float(), size=(self.size,) * 2, mode="area")
        return x.round().to(torch.uint8).reshape(*frame.shape[:-2], 1, self.size, self.size)

    def _reset(self, tensordict, tensordict_reset):
        return self._call(tensordict_reset)

    def transform_observation_spec(self, observation_spec):
        old = observation_spec["observation"]
        shape = old.shape[:-2] + (1, self.size, self.size)
        observation_spec["observation"] = Bounded(0, 255, shape=shape, dtype=torch.uint8, device=old.device)
        return observation_spec


def make_worker(demo: Demo, cfg: Config) -> TransformedEnv:
    """One ALE env restored to starting points; runs inside a ParallelEnv worker (picklable)."""
    # ALE logs its version banner at info level in every process that builds an emulator,
    # so once per worker; warnings and errors still show
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
    gym.register_envs(ale_py)
    env = GymEnv(ENV_ID, frameskip=FRAME_SKIP, repeat_action_probability=0.0, obs_type="grayscale")
    return TransformedEnv(
        env,
        Compose(
            ReverseCurriculum(
                demo, restore="ale", frames_per_step=FRAME_SKIP, max_lag=cfg.max_lag,
                snapshot_every=cfg.snapshot_every,
            ),
            Downsample(84),  # uint8 [210, 160] -> [1, 84, 84]
            CatFrames(N=4, dim=-3, in_keys=["observation"]),  # -> [4, 84, 84]
            SignTransform(in_keys=["reward"]),
        ),
    )


class Encoder(nn.Module):
    """Nature-style CNN, smaller: uint8 [*B, 4, 84, 84] -> float [*B, 256] for any leading dims."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 16, 8, stride=4), nn.ReLU(),  # -> [N, 16, 20, 20]
            nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),  # -> [N, 32, 9, 9]
            nn.Flatten(), nn.Linear(32 * 9 * 9, 256), nn.ReLU(),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        lead = frames.shape[:-3]
        out = self.net(frames.reshape(-1, *frames.shape[-3:]).float() / 255)  # [N, 256]
        return out.reshape(*lead, -1)


def make_actor_critic(num_actions: int, action_spec) -> ActorValueOperator:
    common = TensorDictModule(Encoder(), in_keys=["observation"], out_keys=["hidden"])
    policy = ProbabilisticActor(
        TensorDictModule(nn.Linear(256, num_actions), in_keys=["hidden"], out_keys=["logits"]),
        in_keys=["logits"], spec=action_spec, distribution_class=OneHotCategorical, return_log_prob=True,
    )
    value = ValueOperator(nn.Linear(256, 1), in_keys=["hidden"])
    return ActorValueOperator(common, policy, value)


def plot(rows: list[dict], path: Path, demo_length: int) -> None:
    t = [r["time_s"] / 60 for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 6))
    top.plot(t, [r["max_starting_point"] for r in rows], label="maximum (manager)")
    top.plot(t, [r["min_starting_point"] for r in rows], label="lowest in batch", alpha=0.6)
    top.axhline(demo_length - 1, color="grey", lw=0.5)
    top.set_ylabel("starting point (demo frame)")
    top.legend()
    bottom.plot(t, [r["success_rate"] for r in rows], ".", label="episodes in batch")
    bottom.set_ylabel("success rate")
    bottom.set_xlabel("wall-clock minutes")
    bottom.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(cfg: Config) -> None:
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    demo = demo_with_snapshots(cfg)
    manager = ResetManager(
        len(demo), cfg.num_envs, window=cfg.spacing * cfg.num_envs, move_threshold=cfg.move_threshold, nudge=cfg.nudge
    )
    env = TransformedEnv(
        ParallelEnv(cfg.num_envs, functools.partial(make_worker, demo, cfg)),
        ReverseCurriculum(demo, manager),
    )
    try:
        rows = train(cfg, env, manager, out)
    finally:
        if not env.is_closed:
            env.close()
    print(
        f"maximum starting point {len(demo) - 1} -> {manager.maximum} "
        f"({len(demo) - 1 - manager.maximum} demo frames back) in {rows[-1]['time_s'] / 60:.1f} min"
    )


def train(cfg: Config, env: TransformedEnv, manager: ResetManager, out: Path) -> list[dict]:
    env.set_seed(cfg.seed)
    device = torch.device(cfg.device)
    action_spec = env.full_action_spec["action"]
    model = make_actor_critic(action_spec.shape[-1], action_spec).to(device)
    actor, critic = model.get_policy_operator(), model.get_value_operator()
    advantage = GAE(gamma=cfg.gamma, lmbda=cfg.lmbda, value_network=critic, average_gae=False)
    loss_module = ClipPPOLoss(
        actor, critic, clip_epsilon=cfg.clip, entropy_coeff=cfg.entropy, critic_coeff=0.5,
        loss_critic_type="l2", normalize_advantage=True,
    )
    optim = torch.optim.Adam(loss_module.parameters(), lr=cfg.lr, eps=1e-5)
    frames_per_batch = cfg.num_envs * cfg.steps_per_env
    minibatch = min(cfg.minibatch, frames_per_batch)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch), sampler=SamplerWithoutReplacement(),
        batch_size=minibatch,
    )
    collector = Collector(
        env, actor, frames_per_batch=frames_per_batch, total_frames=cfg.total_frames, device=device
    )

    rows, start = [], time.time()
    bar = tqdm(total=cfg.total_frames, unit="step")
    for data in collector:  # [num_envs, steps_per_env]
        ended = data["next", "done"].squeeze(-1)
        with torch.no_grad():
            advantage(data)
        buffer.extend(data.reshape(-1))
        for _ in range(cfg.epochs):
            for _ in range(frames_per_batch // minibatch):
                losses = loss_module(buffer.sample().to(device))
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), 0.5)
                optim.step()
        collector.update_policy_weights_()

        rows.append({
            "time_s": round(time.time() - start, 1),
            "frames": bar.n + data.numel(),
            "max_starting_point": manager.maximum,
            "min_starting_point": int(data["starting_point"].min()),
            "episodes": int(ended.sum()),
            "success_rate": float(data["next", "success"][ended].float().mean()) if ended.any() else float("nan"),
            "mean_final_score": float(data["next", "score"][ended].mean()) if ended.any() else float("nan"),
            "loss": loss.item(),
        })
        bar.update(data.numel())
        bar.set_postfix(max_sp=manager.maximum, success=f"{rows[-1]['success_rate']:.2f}")
        with open(out / "log.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        plot(rows, out / "curriculum.png", manager.demo_length)
    bar.close()
    collector.shutdown(close_env=False)
    return rows


def parse_args() -> Config:
    return Config(**vars(config_parser(Config, __doc__).parse_args()))

if __name__ == "__main__":  # ParallelEnv workers re-import this module
    main(parse_args())
