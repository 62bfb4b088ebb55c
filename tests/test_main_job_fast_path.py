"""The main job's fast path: the in-process vector env learns what SerialEnv learns, and the
values bootstrapped from are those a per-step critic call gives."""
import pytest
import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector

from torchrl_seqchunk.recipes import ppo as job
from torchrl_seqchunk.recipes.common.agent import make_agent
from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_env
from torchrl_seqchunk.recipes.common.ppo import next_values


def test_vector_and_serial_main_jobs_learn_alike(tmp_path):
    # the observation statistics count only the envs reset (RunningObservationNorm), so the
    # two runs are the same run, normalizers and all
    runs = []
    for batching in ("vector", "serial"):
        cfg = job.Config(env_batching=batching, total_frames=512, num_envs=4, max_episode_steps=40,
                         runs_dir=str(tmp_path), name=batching, progress=False)
        runs.append([{k: v for k, v in row.items() if k != "wall_s"} for row in job.train(cfg).rows])
    assert runs[0] == runs[1]
    assert runs[0][-1]["episodes"] > 0


def test_next_values_are_the_per_step_critic_values():
    # short episodes (TimeLimit 14) put truncations and terminations inside the rollout
    cfg = job.Config(max_episode_steps=14, num_envs=4, rollout_len=24, progress=False)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    collector = Collector(make_acting_env(cfg, rnns, 3), TensorDictSequential(actor, critic),
                          frames_per_batch=96, total_frames=192, auto_register_policy_transforms=False)
    rollout = list(collector)[-1]  # the second rollout starts from carried memory
    collector.shutdown()
    assert rollout["next", "truncated"][:, :-1].any() and rollout["next", "terminated"].any()
    with torch.no_grad():  # the reference: the critic's step on every next observation
        want = critic(rollout["next"].reshape(-1).clone())["state_value"].view(4, 24, 1)
    torch.testing.assert_close(next_values(critic, rollout), want)
