"""Cost of the boundary modes of RecurrentPPOLoss, and of boundary_gae against a Python loop.

1. RecurrentPPOLoss forward + backward on ``--windows`` windows of ``--window``
   steps (GRU actor and critic, ``--hidden`` units, built on ResetRNN with the
   stored memory), once per mode per round, in an order rotating every round.
   ``RATIO reset_continue_vs_mask`` is the ratio of the fastest rounds (the least
   disturbed by other processes; goal <= 1.10: the better estimator costs nothing
   extra).
2. ``boundary_gae`` on a ``[--envs, --steps]`` rollout with random terminations,
   truncations and episode starts, against a per-step Python loop (the GAE
   recursion written step by step over time, vectorised over envs).
   ``RATIO gae_vs_python_loop`` is the ratio of the fastest rounds (goal <= 0.05).
   For context it also times TorchRL's loop and vectorised GAE kernels on the
   same flags.
3. One RecurrentPPOLoss call (forward + backward, ``reset_continue``) on the main
   job's update batch, ``--update-windows`` windows of ``--update-window`` steps with
   GRU actor and critic of ``--update-hidden`` units, against the plain forward and
   backward of the same networks (``nn.GRU`` on the same tensors, no resets, the
   same heads and a surrogate of the same terms): ``RATIO loss_vs_compute_limit``,
   the ratio of the fastest rounds (the loss's overhead over its arithmetic).

    python benchmarks/bench_ppo.py
"""
import argparse
import statistics

import torch
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from timing import seconds_per_call  # benchmarks/timing.py
from toolkit import options  # benchmarks/toolkit.py: the recipes' option checks
from torch import nn
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

from torchrl_seqchunk import RecurrentPPOLoss, ResetRNN, boundary_gae, make_windows

MODES = ("reset_continue", "mask", "inverse_count")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=256)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--obs", type=int, default=32)
    parser.add_argument("--actions", type=int, default=6)
    parser.add_argument("--episode-length", type=float, default=20.0, help="mean episode length")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--update-windows", type=int, default=8)
    parser.add_argument("--update-window", type=int, default=32)
    parser.add_argument("--update-hidden", type=int, default=64)
    parser.add_argument("--update-obs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier)")
    parser.add_argument("--seed", type=int, default=0)
    return options.parse(parser, ints={"windows": 16, "window": 1, "hidden": 1, "obs": 1, "actions": 2, "envs": 1,
                                       "steps": 1, "rounds": 1, "warmup": 0, "threads": 1, "seed": 0},
                         reals={"episode_length": (1.0, None)}, check=check_window)


def check_window(args) -> None:
    if args.window > args.steps:
        raise ValueError(f"--window {args.window} is longer than --steps {args.steps}: give --window <= --steps")


def random_rollout(num_envs, steps, args, generator):
    """A rollout [num_envs, steps] with episodes ending at random (terminated or truncated)."""
    ended = torch.rand(num_envs, steps, 1, generator=generator) < 1 / args.episode_length
    truncated = ended & (torch.rand(num_envs, steps, 1, generator=generator) < 0.3)
    return TensorDict(
        {
            "obs": torch.randn(num_envs, steps, args.obs, generator=generator),
            "action": torch.randint(args.actions, (num_envs, steps), generator=generator),
            "action_log_prob": torch.full((num_envs, steps), -torch.log(torch.tensor(args.actions * 1.0))),
            "actor_state": torch.randn(num_envs, steps, 1, args.hidden, generator=generator),
            "critic_state": torch.randn(num_envs, steps, 1, args.hidden, generator=generator),
            "state_value": torch.randn(num_envs, steps, 1, generator=generator),
            "is_first": torch.rand(num_envs, steps, 1, generator=generator) < 0.01,
            ("next", "state_value"): torch.randn(num_envs, steps, 1, generator=generator),
            ("next", "reward"): torch.randn(num_envs, steps, 1, generator=generator),
            ("next", "done"): ended,
            ("next", "terminated"): ended & ~truncated,
            ("next", "truncated"): truncated,
        },
        batch_size=[num_envs, steps],
    )


def recurrent(name, args):
    return ResetRNN(
        nn.GRU(args.obs, args.hidden, batch_first=True), in_key="obs", out_key=f"{name}_h",
        state_key=f"{name}_state", reset_state_key=f"{name}_state", carry=False,
    )


def build_losses(args):
    actor = ProbabilisticTensorDictSequential(
        recurrent("actor", args),
        TensorDictModule(nn.Linear(args.hidden, args.actions), ["actor_h"], ["logits"]),
        ProbabilisticTensorDictModule(
            ["logits"], ["action"], distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        ),
    )
    critic = TensorDictSequential(
        recurrent("critic", args),
        TensorDictModule(nn.Linear(args.hidden, 1), ["critic_h"], ["state_value"]),
    )
    return {mode: RecurrentPPOLoss(actor, critic, boundary_mode=mode) for mode in MODES}


def stops(td):
    stop = td["next", "done"].clone()
    stop[:, :-1] |= td["is_first"][:, 1:]
    return stop


def python_loop_gae(td, gamma, lmbda):
    """The GAE recursion step by step over time (vectorised over envs)."""
    reward, value = td["next", "reward"], td["state_value"]
    next_value = td["next", "state_value"]
    terminated = td["next", "terminated"].float()
    stop = stops(td)
    advantage = torch.empty_like(value)
    following = torch.zeros_like(value[:, 0])
    for t in reversed(range(value.shape[1])):
        following = following * (~stop[:, t]).float()
        delta = reward[:, t] + gamma * (1 - terminated[:, t]) * next_value[:, t] - value[:, t]
        following = advantage[:, t] = delta + gamma * lmbda * following
    return advantage


def loss_against_compute(args, generator):
    """Fastest-round seconds of one loss call and of the plain compute it contains."""
    sizes = argparse.Namespace(**{**vars(args), "obs": args.update_obs, "hidden": args.update_hidden})
    rollout = random_rollout(args.update_windows, args.update_window, sizes, generator)
    rollout["advantage"] = torch.randn(*rollout.batch_size, 1, generator=generator)
    rollout["value_target"] = torch.randn(*rollout.batch_size, 1, generator=generator)
    windows = make_windows(rollout, args.update_window, memory_key=["actor_state", "critic_state"])
    loss = build_losses(sizes)["reset_continue"]
    actor_gru, critic_gru = loss.actor_network[0].rnn, loss.critic_network[0].rnn
    actor_head, critic_head = loss.actor_network[1].module, loss.critic_network[1].module
    x, action = windows["obs"], windows["action"]
    advantage, target = windows["advantage"].squeeze(-1), windows["value_target"]
    old_log_prob = windows["action_log_prob"]

    def call_loss():
        out = loss(windows)
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()

    def plain():
        dist = torch.distributions.Categorical(logits=actor_head(actor_gru(x)[0]))
        ratio = (dist.log_prob(action) - old_log_prob).exp()
        objective = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
        critic = nn.functional.smooth_l1_loss(critic_head(critic_gru(x)[0]), target)
        (objective + critic - 0.01 * dist.entropy().mean()).backward()

    times = {"loss": [], "plain": []}
    for round_ in range(args.warmup + args.rounds):
        for name, fn in (("loss", call_loss), ("plain", plain)):
            elapsed = seconds_per_call(fn)
            if round_ >= args.warmup:
                times[name].append(elapsed)
    print(f"update batch {tuple(windows.batch_size)}, two GRU-{args.update_hidden}, fastest / median round:")
    for name, values in times.items():
        print(f"{name:>20}: {1e3 * min(values):.2f} / {1e3 * statistics.median(values):.2f} ms forward+backward")
    return min(times["loss"]) / min(times["plain"])


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)

    # 1. loss modes: windows rows * (steps - window + 1) = args.windows
    rows = 16
    per_row = args.windows // rows
    rollout = random_rollout(rows, per_row + args.window - 1, args, generator)
    rollout["advantage"] = torch.randn(*rollout.batch_size, 1, generator=generator)
    rollout["value_target"] = torch.randn(*rollout.batch_size, 1, generator=generator)
    windows = make_windows(rollout, args.window, memory_key=["actor_state", "critic_state"])
    losses = build_losses(args)

    def step(mode):
        out = losses[mode](windows)
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()

    times = {mode: [] for mode in MODES}
    for round_ in range(args.warmup + args.rounds):
        shift = round_ % len(MODES)  # rotate the order so that no mode always runs first
        for mode in MODES[shift:] + MODES[:shift]:
            elapsed = seconds_per_call(lambda: step(mode))
            if round_ >= args.warmup:
                times[mode].append(elapsed)
    ratio = min(times["reset_continue"]) / min(times["mask"])
    print(f"windows {tuple(windows.batch_size)}, GRU {args.hidden}, fastest / median round:")
    for mode in MODES:
        print(
            f"{mode:>15}: {1e3 * min(times[mode]):.1f} / "
            f"{1e3 * statistics.median(times[mode]):.1f} ms forward+backward"
        )

    # 2. advantages on [envs, steps]
    td = random_rollout(args.envs, args.steps, args, generator)
    gamma, lmbda = 0.99, 0.95
    expected = python_loop_gae(td, gamma, lmbda)
    torch.testing.assert_close(
        boundary_gae(td, gamma=gamma, lmbda=lmbda)["advantage"], expected, atol=1e-4, rtol=1e-4
    )
    inputs = (td["state_value"], td["next", "state_value"], td["next", "reward"], stops(td))
    candidates = {
        "boundary_gae": lambda: boundary_gae(td, gamma=gamma, lmbda=lmbda),
        "python loop": lambda: python_loop_gae(td, gamma, lmbda),
        "torchrl loop kernel": lambda: generalized_advantage_estimate(
            gamma, lmbda, *inputs, td["next", "terminated"]
        ),
        "torchrl vec kernel": lambda: vec_generalized_advantage_estimate(
            gamma, lmbda, *inputs, td["next", "terminated"]
        ),
    }
    gae_times = {name: [] for name in candidates}
    for round_ in range(args.warmup + args.rounds):
        for name, fn in candidates.items():
            elapsed = seconds_per_call(fn, repeat=5)  # a burst, so no candidate runs cold alone
            if round_ >= args.warmup:
                gae_times[name].append(elapsed)
    gae_ratio = min(gae_times["boundary_gae"]) / min(gae_times["python loop"])
    print(f"advantages on {tuple(td.batch_size)}, fastest / median round:")
    for name, values in gae_times.items():
        print(f"{name:>20}: {1e3 * min(values):.2f} / {1e3 * statistics.median(values):.2f} ms")
    update_ratio = loss_against_compute(args, generator)
    print(f"RATIO reset_continue_vs_mask {ratio:.3f}")
    print(f"RATIO gae_vs_python_loop {gae_ratio:.3f}")
    print(f"RATIO loss_vs_compute_limit {update_ratio:.3f}")


if __name__ == "__main__":
    main()
