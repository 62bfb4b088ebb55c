"""``python -m torchrl_seqchunk.check ENV_ID``: the recurrence checks on a gymnasium task with the
library's own pipeline, a small recurrent actor-critic built from its public pieces.

    python -m torchrl_seqchunk.check CartPole-v1                        # windows, reset_continue
    python -m torchrl_seqchunk.check CartPole-v1 --layout mask --cell lstm
    python -m torchrl_seqchunk.check CartPole-v1 --layout streams       # stream chunks with carry
    python -m torchrl_seqchunk.check CartPole-v1 --module torchrl --layout slices   # LSTMModule, SliceSampler
    python -m torchrl_seqchunk.check Pendulum-v1 --keep 0,1             # continuous actions

The agent is an encoder, a recurrent trunk (``ResetRNN`` over ``nn.GRU`` / ``nn.LSTM``, or
TorchRL's ``GRUModule`` / ``LSTMModule`` with ``--module torchrl``) and an MLP head, for the
actor and for the critic; the env is ``num_envs`` copies stepped in one vector env
(``torchrl_seqchunk.envs.make_vector_env``) with ``InitTracker`` and the trunks' primers. Prints
the report and a ``TIME`` line; exits with status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torchrl.envs import Compose, InitTracker, TensorDictPrimer, TransformedEnv
from torchrl.modules import (MLP, GRUModule, LSTMModule, OneHotCategorical, ProbabilisticActor, TanhNormal,
                             ValueOperator)
from torchrl.modules.distributions import NormalParamExtractor

from ..envs import DEFAULT_KEEP, make_vector_env
from ..recurrent.module import ResetRNN
from .api import check_recurrence
from .layouts import SliceLayout, StreamLayout, WindowLayout

LAYOUTS = ("windows", "mask", "inverse_count", "streams", "slices")


def trunk(prefix: str, obs_dim: int, *, cell: str, hidden: int, module: str, carry: bool):
    """encoder -> recurrent module for ``prefix`` (``"actor"`` / ``"critic"``): ``(trunk, recurrent module)``."""
    embed, features = f"{prefix}_embed", f"{prefix}_features"
    if module == "torchrl":
        kind = {"gru": GRUModule, "lstm": LSTMModule}[cell]
        names = {"gru": ["recurrent_state"], "lstm": ["recurrent_state_h", "recurrent_state_c"]}[cell]
        keys = [f"{prefix}_{n}" for n in names]
        recurrent = kind(input_size=hidden, hidden_size=hidden, in_keys=[embed, *keys],
                         out_keys=[features, *(("next", k) for k in keys)])
        if carry:  # stream chunks: the module inside ResetRNN, which carries its state
            recurrent = ResetRNN(recurrent, reset_state_key=keys, carry=True)
    else:
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell](hidden, hidden, batch_first=True)
        # windows and stream chunks restart from the stored memory at their reset slots
        recurrent = ResetRNN(rnn, in_key=embed, out_key=features, state_key=f"{prefix}_state",
                             reset_state_key=f"{prefix}_state", carry=carry)
    encoder = Mod(nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh()), ["observation"], [embed])
    return Seq(encoder, recurrent), recurrent


def build(env_id: str, *, num_envs: int = 8, keep=None, max_episode_steps: int | None = None, cell: str = "gru",
          hidden: int = 32, module: str = "resetrnn", carry: bool = False, seed: int = 0):
    """``(actor, critic, env)``: the agent (see the module docstring) and its env, seeded with ``seed``."""
    limit = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    base = make_vector_env(env_id, num_envs, keep, **limit)
    obs_dim = base.observation_spec["observation"].shape[-1]
    spec = base.full_action_spec_unbatched["action"]
    actor_trunk, actor_rnn = trunk("actor", obs_dim, cell=cell, hidden=hidden, module=module, carry=carry)
    critic_trunk, critic_rnn = trunk("critic", obs_dim, cell=cell, hidden=hidden, module=module, carry=carry)

    def mlp(out: int) -> MLP:
        return MLP(in_features=hidden, out_features=out, num_cells=[hidden], activation_class=nn.Tanh)

    if spec.domain == "discrete" and len(spec.shape) == 1:
        head = Mod(mlp(spec.shape[-1]), ["actor_features"], ["logits"])
        dist = dict(in_keys=["logits"], distribution_class=OneHotCategorical)
    elif spec.domain == "continuous":
        head = Mod(nn.Sequential(mlp(2 * spec.shape[-1]), NormalParamExtractor()), ["actor_features"], ["loc", "scale"])
        dist = dict(in_keys=["loc", "scale"], distribution_class=TanhNormal,
                    distribution_kwargs={"low": spec.space.low, "high": spec.space.high})
    else:
        raise ValueError(f"{env_id}: its actions are {type(spec).__name__} {list(spec.shape)}; the command line's "
                         "agent takes one discrete choice or a Box; check other agents with check_recurrence.")
    actor = ProbabilisticActor(Seq(actor_trunk, head), spec=spec, return_log_prob=True, **dist)
    critic = Seq(critic_trunk, ValueOperator(mlp(1), in_keys=["critic_features"]))
    primers = {k: s for r in (actor_rnn, critic_rnn) for k, s in r.make_tensordict_primer().primers.items(True, True)}
    env = TransformedEnv(base, Compose(InitTracker(), TensorDictPrimer(primers, expand_specs=True)))
    env.set_seed(seed)
    return actor, critic, env


def layout_of(args):
    """The layout ``args.layout`` names."""
    is_first = "is_init" if args.module == "torchrl" else "is_first"
    if args.layout in ("windows", "mask", "inverse_count"):
        mode = "reset_continue" if args.layout == "windows" else args.layout
        return WindowLayout(args.window, boundary_mode=mode, is_first_key=is_first)
    if args.layout == "streams":
        return StreamLayout(args.num_streams, args.seq_len, seed=args.seed)
    return SliceLayout(args.window, burn_in=args.burn_in, is_first_key=is_first, seed=args.seed)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m torchrl_seqchunk.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env", help="a gymnasium id, or 'module:id'")
    parser.add_argument("--layout", choices=LAYOUTS, default="windows",
                        help="windows (reset_continue), mask, inverse_count, streams (carry) or slices")
    parser.add_argument("--module", choices=("resetrnn", "torchrl"), default="resetrnn",
                        help="ResetRNN, or TorchRL's GRUModule / LSTMModule (inside ResetRNN on --layout streams)")
    parser.add_argument("--cell", choices=("gru", "lstm"), default="gru")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=125, help="steps per env (8 x 125 = 1,000)")
    parser.add_argument("--keep", default="auto",
                        help="observation indices kept: 'auto' (CartPole: 0,2), 'all' or '0,2'")
    parser.add_argument("--max-episode-steps", type=int, default=None)
    parser.add_argument("--window", type=int, default=8, help="window or slice length")
    parser.add_argument("--burn-in", type=int, default=0, help="slices: steps unrolled before each slice")
    parser.add_argument("--num-streams", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=16, help="streams: chunk length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    for name in ("hidden", "num_envs", "steps", "window", "num_streams", "seq_len", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.burn_in < 0 or args.seed < 0:
        parser.error("--burn-in and --seed must be >= 0")
    if args.window > args.steps:
        parser.error(f"--window {args.window} is longer than --steps {args.steps}")
    if args.burn_in and args.layout != "slices":
        parser.error("--burn-in applies to --layout slices only")
    return args


def kept(args):
    if args.keep == "all":
        return None
    if args.keep == "auto":
        return DEFAULT_KEEP.get(args.env)
    return tuple(int(i) for i in args.keep.split(","))


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        actor, critic, env = build(args.env, num_envs=args.num_envs, keep=kept(args),
                                   max_episode_steps=args.max_episode_steps, cell=args.cell, hidden=args.hidden,
                                   module=args.module, carry=args.layout == "streams", seed=args.seed)
    except (TypeError, ValueError) as error:
        print(f"python -m torchrl_seqchunk.check: error: {error}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    report = check_recurrence(Seq(actor, critic), env, layout_of(args), steps=args.steps, seed=args.seed,
                              threads=args.threads)
    seconds = time.perf_counter() - start
    env.close()
    print(report)
    print(f"TIME check_s {seconds:.2f} ({args.num_envs * args.steps} steps, collection included, "
          f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})")
    return 0 if report.ok else 1
