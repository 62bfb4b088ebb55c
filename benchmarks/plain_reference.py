"""The main job in plain PyTorch: the limit that ``bench_throughput.py``'s RATIO lines read the job against.

The recipe of ``seqchunk ppo`` with its defaults (windows over whole rollout rows,
``reset_continue``), without TensorDict: the same networks (an encoder, one GRU layer and an MLP
head for the actor and the critic, built in ``make_agent``'s order, so a seed gives the same
initial weights), the same normalisation (observations by the running mean and std of every one
seen, counting at a reset only the envs reset, frozen after ``obs_norm_until`` of the run; rewards
by the running std of the discounted return, clipped), the same advantages (GAE cut at episode
ends, truncations and row ends bootstrapped from the critic under the memory after the step,
standardized by ``max(std, advantage_std_floor)``), the same clipped PPO loss and schedules
(learning rate and clip range annealed to 0), and the GRU unrolled over each window by this
package's fused kernel, reset at every episode start to the memory stored when acting.

What it leaves out is what the job's pieces add around the same kernels: TensorDicts, TorchRL's
loss and collector machinery, the checks on their inputs, per-step bookkeeping. It is a
benchmark's yardstick, not a trainer: it runs only the job's defaults (a discrete action, one GRU
layer, an entropy coefficient of 0) and checks nothing. ``tests/test_plain_reference.py`` holds it
to the job: the same initial weights, advantages, loss and gradients on a rollout of the job, and
it learns.

    cfg = PlainConfig(total_frames=20_000)
    rows = PlainPPO(cfg).run()       # [(frames, mean return of the last 20 episodes), ...]

:class:`PlainDQN` is the same yardstick for ``seqchunk dqn``'s gradient step on a stream
chunk (double DQN, n-step targets, a carried state per row, Adam, a soft target update).
:func:`figures` measures the jobs against both, interleaved in this process.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections import deque

import torch
import torch.nn.functional as F
from torch import nn

from torchrl_seqchunk.envs import DEFAULT_KEEP, make_vector_env
from torchrl_seqchunk.recurrent.fused import _GRULayer  # the fused kernel ResetRNN runs on a small CPU batch

__all__ = ["PlainConfig", "PlainDQN", "PlainPPO", "Rollout", "Trunk", "chunk_from_tensordict", "figures",
           "rollout_from_tensordict"]


@dataclasses.dataclass(frozen=True)
class PlainConfig:
    """The main job's defaults (``Config`` of ``seqchunk ppo``; a test keeps them equal)."""
    env: str = "CartPole-v1"
    num_envs: int = 8
    rollout_len: int = 32
    hidden: int = 64
    gamma: float = 0.99
    lmbda: float = 0.8
    lr: float = 1e-3
    clip_epsilon: float = 0.2
    critic_coeff: float = 0.5
    max_grad_norm: float = 0.5
    epochs: int = 10
    advantage_std_floor: float = 0.2
    obs_norm_until: float = 0.4
    total_frames: int = 100_000
    return_window: int = 20
    seed: int = 0


class Trunk(nn.Module):
    """Encoder (Linear + Tanh) -> GRU -> head (Linear, Tanh, Linear): one of the job's two networks.

    The head is given after both trunks are built (:meth:`add_head`), in ``make_agent``'s order."""

    def __init__(self, obs_dim: int, hidden: int):
        super().__init__()
        self.gru = nn.GRU(hidden, hidden, batch_first=True)  # make_agent builds the recurrent layer first
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())

    def add_head(self, out: int) -> Trunk:
        hidden = self.gru.hidden_size
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, out))
        return self

    def step(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of every env: ``obs [N, D]``, ``h [N, H]`` -> (head output ``[N, out]``, new ``h``)."""
        h = torch.gru_cell(self.encoder(obs), h, self.gru.weight_ih_l0, self.gru.weight_hh_l0,
                           self.gru.bias_ih_l0, self.gru.bias_hh_l0)
        return self.head(h), h

    def unroll(self, obs: torch.Tensor, reset: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Windows ``obs [B, T, D]``, bool ``reset [B, T]`` (slot 0 True), the memory stored when acting
        ``[B, T, H]`` taken at every reset -> head outputs ``[B, T, out]``."""
        g = self.gru
        h0 = memory[:, 0]  # never read: slot 0 resets
        y, _ = _GRULayer.apply(self.encoder(obs), reset, h0, memory, g.weight_ih_l0, g.weight_hh_l0,
                               g.bias_ih_l0, g.bias_hh_l0)
        return self.head(y)


class RunningMoments:
    """Running mean and population variance, merged batch by batch in float64 (Chan, Golub and LeVeque)."""

    def __init__(self, shape, *, count: float = 0.0, var: float = 0.0):
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.var = torch.full(shape, var, dtype=torch.float64)
        self.count = count

    def merge(self, rows: torch.Tensor) -> None:
        n = rows.shape[0]
        if not n:
            return
        batch_var, batch_mean = torch.var_mean(rows.to(torch.float64), 0, correction=0)
        old, total = self.count, self.count + n
        delta = batch_mean - self.mean
        self.var.mul_(old / total).add_(batch_var, alpha=n / total).addcmul_(delta, delta, value=old * n / total**2)
        self.mean.add_(delta, alpha=n / total)
        self.count = total


@dataclasses.dataclass
class Rollout:
    """One rollout, every entry ``[N, T, ...]``: what acting stores and the update reads."""
    obs: torch.Tensor           # float [N, T, D], normalized
    is_first: torch.Tensor      # bool [N, T], the step starts an episode (or the rollout: set by the update)
    actor_memory: torch.Tensor  # float [N, T, H], the actor's state the step started from
    critic_memory: torch.Tensor
    action: torch.Tensor        # int64 [N, T, 1]
    log_prob: torch.Tensor      # float [N, T, 1]
    value: torch.Tensor         # float [N, T, 1]
    reward: torch.Tensor        # float [N, T, 1], scaled
    done: torch.Tensor          # bool [N, T, 1]
    terminated: torch.Tensor    # bool [N, T, 1]
    next_obs: torch.Tensor      # float [N, T, D], the step's next observation (a done step's last one)
    next_critic_memory: torch.Tensor  # float [N, T, H], the critic's state after the step
    advantage: torch.Tensor | None = None
    value_target: torch.Tensor | None = None

    @classmethod
    def empty(cls, num_envs: int, steps: int, obs_dim: int, hidden: int) -> Rollout:
        def make(*shape, dtype=torch.float32):
            return torch.empty(num_envs, steps, *shape, dtype=dtype)
        return cls(make(obs_dim), make(dtype=torch.bool), make(hidden), make(hidden), make(1, dtype=torch.long),
                   make(1), make(1), make(1), make(1, dtype=torch.bool), make(1, dtype=torch.bool), make(obs_dim),
                   make(hidden))


class PlainPPO:
    """The job's loop, ``run()``: collect a rollout, compute its advantages, update, anneal.

    Each part is a method, timed on its own by the benchmark: :meth:`collect` (one rollout of
    ``rollout_len`` steps of every env), :meth:`add_advantages`, :meth:`batches` and :meth:`update`
    (``epochs`` gradient steps on the rollout's rows, shuffled)."""

    def __init__(self, cfg: PlainConfig = PlainConfig()):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        keep = DEFAULT_KEEP.get(cfg.env)
        self.env = make_vector_env(cfg.env, cfg.num_envs, keep)._env  # the gymnasium SyncVectorEnv, no autoreset
        obs_dim, n_actions = self.env.single_observation_space.shape[0], int(self.env.single_action_space.n)
        actor, critic = Trunk(obs_dim, cfg.hidden), Trunk(obs_dim, cfg.hidden)
        self.actor, self.critic = actor.add_head(n_actions), critic.add_head(1)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.optim = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5)
        self.clip_epsilon = cfg.clip_epsilon
        self.obs_stats, self.obs_frozen = RunningMoments((obs_dim,)), False
        self.return_stats = RunningMoments((), count=1e-4, var=1.0)  # VecNormalize's initial statistics
        n = cfg.num_envs
        self.discounted = torch.zeros(n)
        self.episode_return, self.finished = torch.zeros(n), deque(maxlen=cfg.return_window)
        obs, _ = self.env.reset(seed=[cfg.seed + i for i in range(n)])
        self.obs = self.normalize(torch.as_tensor(obs, dtype=torch.float32))
        self.is_init = torch.ones(n, dtype=torch.bool)
        self.h_actor, self.h_critic = torch.zeros(n, cfg.hidden), torch.zeros(n, cfg.hidden)
        self.frames_per_batch = n * cfg.rollout_len
        self.planned = -(-cfg.total_frames // self.frames_per_batch) * self.frames_per_batch
        self.frames = 0

    def normalize(self, obs: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
        if not self.obs_frozen:
            self.obs_stats.merge(obs if counted is None else obs[counted])
        return ((obs - self.obs_stats.mean) / self.obs_stats.var.sqrt().clamp_min(1e-4)).to(obs.dtype)

    def scale(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        returns = self.discounted * self.cfg.gamma + reward
        self.return_stats.merge(returns)
        self.discounted = returns.masked_fill(done, 0.0)
        return (reward / torch.sqrt(self.return_stats.var + 1e-8).float()).clamp(-10.0, 10.0)

    @torch.no_grad()
    def collect(self) -> Rollout:
        cfg = self.cfg
        out = Rollout.empty(cfg.num_envs, cfg.rollout_len, self.obs.shape[1], cfg.hidden)
        for t in range(cfg.rollout_len):
            h_actor, h_critic = self.h_actor.masked_fill(self.is_init[:, None], 0.0), self.h_critic.masked_fill(
                self.is_init[:, None], 0.0)
            out.obs[:, t], out.is_first[:, t], out.actor_memory[:, t], out.critic_memory[:, t] = (
                self.obs, self.is_init, h_actor, h_critic)
            logits, self.h_actor = self.actor.step(self.obs, h_actor)
            value, self.h_critic = self.critic.step(self.obs, h_critic)
            log_p = logits.log_softmax(-1)
            action = torch.multinomial(log_p.exp(), 1)  # [N, 1]
            out.action[:, t], out.log_prob[:, t], out.value[:, t] = action, log_p.gather(-1, action), value
            obs, reward, terminated, truncated, _ = self.env.step(action.view(-1).numpy())
            done_np = terminated | truncated
            reward, done = torch.as_tensor(reward, dtype=torch.float32), torch.from_numpy(done_np)
            self.episode_return += reward
            obs = self.normalize(torch.as_tensor(obs, dtype=torch.float32))
            out.reward[:, t, 0], out.done[:, t, 0] = self.scale(reward, done), done
            out.terminated[:, t, 0] = torch.from_numpy(terminated)
            out.next_obs[:, t], out.next_critic_memory[:, t] = obs, self.h_critic
            if done_np.any():
                self.finished.extend(self.episode_return[done].tolist())
                self.episode_return.masked_fill_(done, 0.0)
                first, _ = self.env.reset(options={"reset_mask": done_np})
                first = self.normalize(torch.as_tensor(first, dtype=torch.float32), counted=done)
                obs = torch.where(done[:, None], first, obs)
            self.obs, self.is_init = obs, done
        return out

    @torch.no_grad()
    def add_advantages(self, rollout: Rollout) -> Rollout:
        cfg = self.cfg
        ends = rollout.done.squeeze(-1).clone()
        ends[:, -1] = True
        next_value = rollout.value.roll(-1, 1)  # V(s_{t+1}) where the episode goes on; ends from the critic
        next_value[ends] = self.critic.step(rollout.next_obs[ends], rollout.next_critic_memory[ends])[0]
        going_on = (~rollout.terminated).float()
        delta = rollout.reward + cfg.gamma * going_on * next_value - rollout.value
        chained = cfg.gamma * cfg.lmbda * (~ends).float().unsqueeze(-1)
        advantage, running = torch.empty_like(delta), torch.zeros_like(delta[:, 0])
        for t in range(delta.shape[1] - 1, -1, -1):
            running = delta[:, t] + chained[:, t] * running
            advantage[:, t] = running
        rollout.value_target = advantage + rollout.value
        rollout.advantage = (advantage - advantage.mean()) / advantage.std().clamp_min(max(1e-8, cfg.advantage_std_floor))
        return rollout

    def batches(self, rollout: Rollout) -> list[dict]:
        """One batch per gradient step: the windows (the rollout's rows, every window starting from its
        stored memory) in a new order each epoch, holding what :meth:`loss` reads."""
        reset = rollout.is_first.clone()
        reset[:, 0] = True
        window = {"obs": rollout.obs, "reset": reset, "actor_memory": rollout.actor_memory,
                  "critic_memory": rollout.critic_memory, "action": rollout.action, "log_prob": rollout.log_prob,
                  "advantage": rollout.advantage, "value_target": rollout.value_target}
        batches = []
        for _ in range(self.cfg.epochs):
            order = torch.randperm(self.cfg.num_envs)
            batches.append({name: value[order] for name, value in window.items()})
        return batches

    def loss(self, batch: dict) -> torch.Tensor:
        """The clipped PPO loss of a batch of windows plus the weighted value loss."""
        logits = self.actor.unroll(batch["obs"], batch["reset"], batch["actor_memory"])
        log_weight = logits.log_softmax(-1).gather(-1, batch["action"]) - batch["log_prob"]
        eps, advantage = self.clip_epsilon, batch["advantage"]
        clipped = log_weight.clamp(math.log1p(-eps), math.log1p(eps))
        gain = torch.minimum(log_weight.exp() * advantage, clipped.exp() * advantage)
        value = self.critic.unroll(batch["obs"], batch["reset"], batch["critic_memory"])
        return -gain.mean() + self.cfg.critic_coeff * (batch["value_target"] - value).pow(2).mean()

    def update(self, batches: list[dict]) -> torch.Tensor:
        """One gradient step per batch; the last loss (detached)."""
        for batch in batches:
            loss = self.loss(batch)
            self.optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            self.optim.step()
        return loss.detach()

    def anneal(self) -> None:
        remaining = max(0.0, 1 - self.frames / self.planned)
        for group in self.optim.param_groups:
            group["lr"] = self.cfg.lr * remaining
        self.clip_epsilon = self.cfg.clip_epsilon * remaining
        if self.cfg.obs_norm_until < 1 and 1 - remaining >= self.cfg.obs_norm_until:
            self.obs_frozen = True

    def iteration(self) -> None:
        """One rollout: collect, advantages, update, schedules."""
        self.update(self.batches(self.add_advantages(self.collect())))
        self.frames += self.frames_per_batch
        self.anneal()

    def run(self, frames: int | None = None) -> list[tuple[int, float]]:
        """Iterations until ``frames`` (default: the run's planned frames); ``(frames, mean return of the
        last return_window episodes)`` after each."""
        rows, stop = [], self.planned if frames is None else self.frames + frames
        while self.frames < stop:
            self.iteration()
            rows.append((self.frames, sum(self.finished) / len(self.finished) if self.finished else float("nan")))
        return rows


def rollout_from_tensordict(td, *, actor_state: str = "actor_state", critic_state: str = "critic_state") -> Rollout:
    """The main job's rollout TensorDict ``[N, T]`` as a :class:`Rollout` (the same steps, for timing
    the plain update on the job's data): its one-hot actions as indices, its ``[N, T, 1, H]`` GRU states
    as ``[N, T, H]``."""
    def memory(key):
        return td[key].flatten(2)
    return Rollout(td["observation"], td["is_init"].squeeze(-1), memory(actor_state), memory(critic_state),
                   td["action"].argmax(-1, keepdim=True), td["action_log_prob"].unsqueeze(-1), td["state_value"],
                   td["next", "reward"], td["next", "done"], td["next", "terminated"], td["next", "observation"],
                   memory(("next", critic_state)))


class PlainDQN:
    """``seqchunk dqn``'s gradient step on stream chunks ``[B, T]`` in plain PyTorch.

    The Q-network is its network (encoder, GRU, a ReLU MLP head); the online and the target
    network each unroll every row once over its ``T`` steps and the observation its last step
    reaches (``T + 1`` steps, the fused kernel, resets to zeros at every episode start), from the
    state the row carried out of the previous chunk; the double-DQN bootstrap
    ``Q_target(s', argmax Q_online(s'))`` gives n-step targets cut at episode ends; a Huber loss,
    Adam, the gradient norm clipped, the target moved by ``tau`` towards the online network. A
    truncated step bootstraps from the row's next step (the recipe's unroll inserts the final
    observation there, one more recurrent step per truncation; CartPole truncates at 500 steps)."""

    def __init__(self, obs_dim: int, n_actions: int, *, hidden: int = 64, gamma: float = 0.99, n_steps: int = 3,
                 lr: float = 5e-4, max_grad_norm: float = 10.0, tau: float = 0.01):
        self.online = Trunk(obs_dim, hidden)
        self.online.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params, self.target_params = list(self.online.parameters()), list(self.target.parameters())
        self.optim = torch.optim.Adam(self.params, lr=lr)
        self.gamma, self.n_steps, self.max_grad_norm, self.tau = gamma, n_steps, max_grad_norm, tau
        self.carries = {"online": None, "target": None}

    def unroll(self, net: Trunk, name: str, chunk: dict) -> torch.Tensor:
        """Q-values ``[B, T + 1, A]``: the chunk's steps and its last step's next observation."""
        obs = torch.cat([chunk["obs"], chunk["next_obs"][:, -1:]], 1)
        starts = chunk["is_first"].clone()
        starts[:, 1:] |= chunk["done"][:, :-1]
        reset = torch.cat([starts, torch.zeros_like(starts[:, :1])], 1)
        carry = self.carries[name]
        h0 = obs.new_zeros(obs.shape[0], net.gru.hidden_size) if carry is None else carry
        g = net.gru
        y, _ = _GRULayer.apply(net.encoder(obs), reset, h0, None, g.weight_ih_l0, g.weight_hh_l0, g.bias_ih_l0,
                               g.bias_hh_l0)
        self.carries[name] = y[:, -2].detach().masked_fill(chunk["done"][:, -1:], 0.0)  # after the last step
        return net.head(y)

    def targets(self, chunk: dict, next_value: torch.Tensor) -> torch.Tensor:
        """n-step targets ``[B, T]``, each cut at its episode's end and at the row's end."""
        stop = chunk["done"].clone()
        stop[:, :-1] |= chunk["is_first"][:, 1:]
        stop[:, -1] = True
        bootstrap = next_value.masked_fill(chunk["terminated"], 0.0)

        def ahead(x, k, fill):  # x[:, t + k] at t, fill past the row's end
            return x if k == 0 else torch.cat([x[:, k:], torch.full_like(x[:, :k], fill)], 1)

        target, running, discount = torch.zeros_like(next_value), torch.ones_like(stop), 1.0
        for k in range(min(self.n_steps, stop.shape[1])):
            stop_k = ahead(stop, k, True)
            target = target + torch.where(running, discount * ahead(chunk["reward"], k, 0.0), 0.0)
            last = running & (stop_k if k < self.n_steps - 1 else torch.ones_like(stop_k))
            target = target + torch.where(last, discount * self.gamma * ahead(bootstrap, k, 0.0), 0.0)
            running = running & ~stop_k
            discount *= self.gamma
        return target

    def step(self, chunk: dict) -> torch.Tensor:
        """One gradient step on a chunk (a dict of ``[B, T]`` entries, see :func:`chunk_from_tensordict`)."""
        q = self.unroll(self.online, "online", chunk)
        with torch.no_grad():
            q_target = self.unroll(self.target, "target", chunk)
            greedy = q[:, 1:].detach().argmax(-1, keepdim=True)
            target = self.targets(chunk, q_target[:, 1:].gather(-1, greedy).squeeze(-1))
        chosen = q[:, :-1].gather(-1, chunk["action"].unsqueeze(-1)).squeeze(-1)
        loss = F.smooth_l1_loss(chosen, target)
        self.optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optim.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.params, self.tau)
        return loss.detach()


def chunk_from_tensordict(td) -> dict:
    """A replay chunk TensorDict ``[B, T]`` of ``seqchunk dqn`` as :class:`PlainDQN` reads it."""
    return {"obs": td["observation"], "next_obs": td["next", "observation"], "is_first": td["is_first"].squeeze(-1),
            "done": td["next", "done"].squeeze(-1), "terminated": td["next", "terminated"].squeeze(-1),
            "reward": td["next", "reward"].squeeze(-1), "action": td["action"].argmax(-1)}


def _paired(sides: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each side's call, the sides called in turn ``rounds`` times (each round under one load)."""
    seconds = {name: [] for name in sides}
    for _ in range(rounds):
        for name, call in sides.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def _ratio(seconds: dict, ours: str, theirs: str) -> float:
    """The median over rounds of ``ours / theirs`` (time: below 1 is faster)."""
    return statistics.median(a / b for a, b in zip(seconds[ours], seconds[theirs]))


def figures(*, frames: int, rounds: int, seed: int = 0) -> list[tuple]:
    """``(name, value, unit, note)`` rows: the main job and its parts, and the recurrent DQN's gradient
    step, each beside this module's plain version, interleaved: ``main_job_vs_plain_reference``
    (end-to-end frames/s over the plain one's, ``rounds`` runs of ``frames`` each), ``update_vs_plain_update``
    and ``collect_vs_plain_collect`` (seconds over the plain one's, on the same rollout, ``5 * rounds``
    rounds), ``dqn_step_vs_plain_dqn_step`` (seconds of a gradient step on the same chunks)."""
    from torchrl_seqchunk.recipes import dqn as recurrent_dqn, dqn_replay
    from bench_learning import run_ours
    from torchrl_seqchunk.recipes.common.agent import make_agent
    from torchrl_seqchunk.recipes.common.batching import make_batching
    from torchrl_seqchunk.recipes.common.envs import make_acting_env, make_collector, make_env
    from torchrl_seqchunk.recipes.common.ppo import add_advantages, update
    from tensordict.nn import TensorDictSequential
    from torchrl_seqchunk.recipes import ppo as main_job

    rows, many = [], 5 * rounds
    cfg = main_job.Config(seed=seed, progress=False, env_batching="vector")

    def job_run():
        rows_ = run_ours(seed, frames, env_batching="vector")
        return rows_[-1]["wall_s"] / rows_[-1]["frames"]  # seconds per frame, from the job's own clock

    def plain_run():
        start, ppo = time.perf_counter(), PlainPPO(dataclasses.replace(PlainConfig(), total_frames=frames, seed=seed))
        ppo.run()
        return (time.perf_counter() - start) / ppo.frames

    per_frame = {"job": [], "plain": []}
    for _ in range(rounds):
        per_frame["job"].append(job_run())
        per_frame["plain"].append(plain_run())
    rows.append(("main_job_vs_plain_reference", _ratio(per_frame, "plain", "job"), "ratio",
                 f"frames/s, {frames} frames end to end, median of {rounds} interleaved runs"))

    torch.manual_seed(seed)
    actor, critic, rnns = make_agent(cfg, make_env(cfg), carry=False)
    per_batch = cfg.num_envs * cfg.rollout_len
    collector = make_collector(cfg, make_acting_env(cfg, rnns, seed), TensorDictSequential(actor, critic), per_batch, -1)
    rollouts = iter(collector)
    rollout = add_advantages(cfg, critic, next(rollouts))
    batching = make_batching(cfg, rnns, per_batch)
    loss = batching.make_loss(actor, critic)
    optim = torch.optim.Adam(loss.parameters(), lr=0.0, eps=1e-5)  # lr 0: every round updates the same networks
    batches = batching.batches(rollout)
    plain = PlainPPO(dataclasses.replace(PlainConfig(), seed=seed))
    for group in plain.optim.param_groups:
        group["lr"] = 0.0
    plain_batches = plain.batches(plain.add_advantages(rollout_from_tensordict(rollout)))
    sides = {"collect": lambda: next(rollouts), "plain_collect": plain.collect,
             "update": lambda: update(loss, optim, batches, weight=batching.weight, max_grad_norm=cfg.max_grad_norm),
             "plain_update": lambda: plain.update(plain_batches)}
    _paired(sides, 1)  # warm-up
    seconds = _paired(sides, many)
    collector.shutdown()
    torch.set_num_threads(1)
    rows.append(("update_vs_plain_update", _ratio(seconds, "update", "plain_update"), "ratio",
                 f"seconds of {len(batches)} gradient steps on one rollout, median of {many} interleaved rounds"))
    rows.append(("collect_vs_plain_collect", _ratio(seconds, "collect", "plain_collect"), "ratio",
                 f"seconds of a rollout of {per_batch} frames, median of {many} interleaved rounds"))

    dqn = recurrent_dqn.Config(seed=seed, progress=False, env_batching="vector")
    qnet, rnn, policy = recurrent_dqn.make_qnet(dqn, recurrent_dqn.envs.make_env(dqn))
    collector = recurrent_dqn.envs.make_collector(dqn, recurrent_dqn.envs.make_acting_env(dqn, [rnn], seed), policy,
                                                  dqn.frames_per_batch, dqn.learning_starts)
    buffer = dqn_replay.make_buffer(dqn)
    for batch in collector:
        dqn_replay.write(dqn, buffer, batch)
    collector.shutdown()
    torch.set_num_threads(1)
    training = dqn_replay.batches(dqn, buffer)
    chunks = [next(training) for _ in range(8)]
    dqn_loss, updater = recurrent_dqn.make_loss(dqn, qnet, rnn)
    dqn_optim = torch.optim.Adam(dqn_loss.parameters(), lr=dqn.lr)
    obs_dim, n_actions = chunks[0]["observation"].shape[-1], chunks[0]["action"].shape[-1]
    plain_dqn = PlainDQN(obs_dim, n_actions, hidden=dqn.hidden, gamma=dqn.gamma, n_steps=dqn.n_steps, lr=dqn.lr,
                         max_grad_norm=dqn.max_grad_norm, tau=dqn.tau)
    plain_chunks = [chunk_from_tensordict(chunk) for chunk in chunks]

    def dqn_steps():  # the recipe's gradient step, its logging read included
        for chunk in chunks:
            out = dqn_loss(chunk)
            dqn_optim.zero_grad()
            out["loss"].backward()
            nn.utils.clip_grad_norm_(dqn_loss.parameters(), dqn.max_grad_norm)
            dqn_optim.step()
            updater.step()
            int(out["recurrent_steps"]), out["loss"].item(), out["td_error"].item()

    def plain_dqn_steps():
        for chunk in plain_chunks:
            plain_dqn.step(chunk)

    sides = {"dqn": dqn_steps, "plain_dqn": plain_dqn_steps}
    _paired(sides, 1)
    seconds = _paired(sides, many)
    rows.append(("dqn_step_vs_plain_dqn_step", _ratio(seconds, "dqn", "plain_dqn"), "ratio",
                 f"seconds of {len(chunks)} gradient steps on chunks {list(chunks[0].shape)}, median of {many} "
                 "interleaved rounds"))
    return rows
