"""Each check against a reference computed here: the slot it names first, the size and count it reports."""
import pytest
import torch
from pipelines import (STEPS, burn_in_leak, carry_not_reset, done_shifted, ppo_agent,
                       slice_starts_reset)  # tests/check/pipelines.py
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

from torchrl_seqchunk import StreamChunkSampler
from torchrl_seqchunk.check import CheckResult, RecurrenceReport, StreamLayout, TrainingLayout, WindowLayout, \
    check_recurrence
from torchrl_seqchunk.check.checks import Tolerance
from torchrl_seqchunk.check.leaks import colourings
from torchrl_seqchunk.check.network import Network, find_memory
from torchrl_seqchunk.check.reference import prepare, step_reference


def collected(policy, env, steps=STEPS):
    """A rollout ``[E, T]`` acted by ``policy``, collected here (not by the checker)."""
    with torch.no_grad(), set_recurrent_mode(False), set_exploration_type(ExplorationType.RANDOM):
        rollout = env.rollout(steps, policy, break_when_any_done=False)
    env.close()
    return rollout


@pytest.fixture(scope="module")
def ppo():
    torch.manual_seed(0)
    actor, critic, env = ppo_agent()
    policy = Seq(actor, critic)
    return policy, collected(policy, env)


def test_the_reference_is_the_policy_unrolled_by_hand(ppo):
    policy, rollout = ppo
    rnn = policy[0].module[0][0][1]  # actor -> trunk -> (encoder, ResetRNN)
    encoder, gru, head = policy[0].module[0][0][0], rnn.rnn, policy[0].module[0][1]
    net = Network(policy, find_memory(policy))
    td, episodes = prepare(rollout, "is_init")
    ref = step_reference(net, td, episodes, "is_init")
    with torch.no_grad():
        h = rollout["actor_state"][:, 0].transpose(0, 1).contiguous()  # [1, E, H]
        for t in range(STEPS):
            h = torch.where(rollout["is_init"][:, t].reshape(1, -1, 1), 0.0, h)
            torch.testing.assert_close(ref.used["actor_state"][:, t], h.transpose(0, 1))
            x = encoder.module(rollout["observation"][:, t]).unsqueeze(1)
            out, h = gru(x, h)
            torch.testing.assert_close(ref.outputs["actor_features"][:, t], out[:, 0])
            torch.testing.assert_close(ref.outputs["logits"][:, t], head.module(out[:, 0]))
            torch.testing.assert_close(ref.after["actor_state"][:, t], h.transpose(0, 1))
            fresh, _ = gru(x, torch.zeros_like(h))
            torch.testing.assert_close(ref.fresh["actor_features"][:, t], fresh[:, 0])


def test_a_corrupted_stored_memory_is_named_at_its_step_with_its_size(ppo):
    policy, rollout = ppo
    rollout = rollout.clone()
    rollout["actor_state"][2, 17] += 0.25
    rollout["actor_state"][4, 3] -= 0.5
    report = check_recurrence(policy, rollout, WindowLayout(8))
    memory = report["stored_memory"]
    assert memory.failed and memory.first == (2, 17) and memory.difference == pytest.approx(0.5)
    assert memory.note.startswith("2 steps store another memory")
    # windows starting there take the corrupted memory: their first slot is the first that differs
    assert report["step_vs_sequence"].first == (2, 17)
    assert {r.name for r in report.failures} == {"stored_memory", "step_vs_sequence", "ppo_ratio"}


def test_a_stored_log_probability_off_by_0_1_gives_a_ratio_off_by_its_exponential(ppo):
    policy, rollout = ppo
    rollout = rollout.clone()
    rollout["action_log_prob"][1, 30] -= 0.1
    report = check_recurrence(policy, rollout, WindowLayout(8), checks=["ppo_ratio", "step_vs_sequence"])
    ratio = report["ppo_ratio"]
    assert ratio.failed and ratio.first == (1, 30)
    assert ratio.difference == pytest.approx(torch.tensor(0.1).exp().item() - 1, rel=1e-4)
    assert ratio.note.startswith("ratio != 1 at 8 slots")  # the 8 windows of 8 holding step 30
    assert not report["step_vs_sequence"].failed  # the policy itself is consistent
    assert [r.name for r in report.results] == ["step_vs_sequence", "ppo_ratio"]


def test_done_alignment_names_every_episode_end_in_every_window_holding_it():
    torch.manual_seed(0)
    policy, env, layout, options = done_shifted()
    rollout = collected(policy, env)
    report = check_recurrence(policy, rollout, layout, **options)
    is_init = rollout["is_init"].squeeze(-1)
    ends = torch.zeros_like(is_init)
    ends[:, :-1] = is_init[:, 1:]
    ends |= rollout["next", "done"].squeeze(-1)
    start = is_init.clone()
    start[:, 0] = True
    ends &= ~start  # a one-step episode ends where it starts: a reset there is right
    env_t = ends.nonzero().tolist()
    window = layout.window
    windows = sum(min(t, STEPS - window) - max(0, t - window + 1) + 1 for _, t in env_t)
    result = report["done_alignment"]
    assert result.first == tuple(env_t[0])
    assert result.note.startswith(f"{windows} episode ends reset at their own step, one step early")


def stream_chunks(rollout, num_streams, seq_len):
    """The chunks StreamLayout draws, replayed here with episode ids counted here."""
    start = rollout["is_init"].squeeze(-1).clone()
    start[:, 0] = True
    data = rollout.clone(False)
    data["episode"] = start.reshape(-1).long().cumsum(0).reshape(start.shape) - 1
    data["env"] = torch.arange(rollout.shape[0]).unsqueeze(1).expand(rollout.shape)
    data["t"] = torch.arange(rollout.shape[1]).expand(rollout.shape)
    sampler = StreamChunkSampler(num_streams, seq_len, replacement=False, traj_key="episode", only_complete=False,
                                 seed=0)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(rollout.numel()), sampler=sampler,
                                    batch_size=num_streams * seq_len)
    buffer.extend(data.reshape(-1))
    chunks = []
    while not chunks or not sampler.ran_out:
        chunks.append(buffer.sample())
    return chunks


def test_a_carry_not_reset_is_named_at_the_first_episode_a_chunk_starts_from_the_carry():
    torch.manual_seed(0)
    policy, env, layout, options = carry_not_reset()
    rollout = collected(policy, env)
    report = check_recurrence(policy, rollout, layout, **options)
    chunks = stream_chunks(rollout, layout.num_streams, layout.seq_len)
    carried = {}  # episodes whose first step is a chunk's first, after a chunk of the same stream
    for chunk in chunks[1:]:
        first = chunk["is_first"][:, 0, 0] & chunk[("collector", "mask")][:, 0]
        for episode, env_, t in zip(chunk["episode"][first, 0].tolist(), chunk["env"][first, 0].tolist(),
                                    chunk["t"][first, 0].tolist()):
            carried[episode] = (env_, t)
    assert carried, "the rollout must hold an episode starting at a chunk's first step"
    expected_first = min(carried.values())
    # the carry reaches every later step of such an episode, and of one that starts where it ends
    assert report["carry"].first == expected_first and report["resets"].first == expected_first
    assert report["carry"].note.startswith(report["resets"].note.split("into ")[1].split(" slots")[0] + " slots")


def test_a_leaking_burn_in_is_named_at_an_episode_start_and_a_reset_slice_start_where_the_episode_goes_on():
    torch.manual_seed(0)
    policy, env, layout, options = burn_in_leak()
    rollout = collected(policy, env)
    leak = check_recurrence(policy, rollout, layout, **options)["resets"]
    assert leak.failed and "memory crosses an episode start" in leak.note
    assert bool(rollout["is_init"][leak.first])  # the kept first step the burnt-in state was copied into

    torch.manual_seed(0)
    policy, env, layout, options = slice_starts_reset()
    rollout = collected(policy, env)
    result = check_recurrence(policy, rollout, layout, **options)["resets"]
    count = int(result.note.split(" slots reset")[0])
    assert result.note.endswith(f"({count} at a row's first step)")  # nowhere else
    assert not bool(rollout["is_init"][result.first])  # a slice start inside an episode


def test_tolerance_reads_as_torch_isclose():
    a, b = torch.randn(50, 3, 4), torch.randn(50, 3, 4)
    b[::2] = a[::2] + 1e-6 * torch.randn(25, 3, 4)
    tol = Tolerance(1e-5, 1e-4)
    distance, absolute = tol.distance({"x": a}, {"x": b}, ["x"])
    close = torch.isclose(a.double(), b.double(), rtol=1e-4, atol=1e-5).flatten(1).all(1)
    assert torch.equal(distance <= 1, close) and close[::2].all() and not close[1::2].any()
    torch.testing.assert_close(absolute, (a - b).abs().flatten(1).amax(1).double())
    a[3, 0, 0] = float("nan")
    assert tol.distance({"x": a}, {"x": b}, ["x"])[0][3] == float("inf")


def test_colourings_split_every_boundary_of_an_odd_cycle():
    found, left = colourings(3, {(0, 1), (1, 2), (2, 0)})
    assert left == 0 and len(found) == 2
    assert all(any(c[a] != c[b] for c in found) for a, b in [(0, 1), (1, 2), (2, 0)])
    path, left = colourings(4, {(0, 1), (1, 2), (2, 3)})
    assert left == 0 and len(path) == 1


def test_the_report_lists_every_failure_and_skips_do_not_fail():
    report = RecurrenceReport([CheckResult("resets", "FAIL", 9, (1, 2), 0.25, "memory crosses"),
                               CheckResult("carry", "skip", note="no carry"),
                               CheckResult("stored_memory", "FAIL", 4, (0, 0), 1.5, "after the step")])
    assert not report.ok and [r.name for r in report.failures] == ["resets", "stored_memory"]
    with pytest.raises(AssertionError) as error:
        report.assert_ok()
    message = str(error.value)
    assert "resets at (env, t) = (1, 2), difference 0.25: memory crosses" in message
    assert "stored_memory at (env, t) = (0, 0), difference 1.5: after the step" in message
    assert len(str(report).splitlines()) == 4  # header and one line per check
    RecurrenceReport([CheckResult("carry", "skip")]).assert_ok()
    with pytest.raises(KeyError, match="no check named 'ratio'"):
        report["ratio"]


class Shuffled(WindowLayout):
    def batches(self, rollout, memory_keys):
        for batch in super().batches(rollout, memory_keys):
            yield batch[torch.randperm(batch.shape[0])]


class Unmarked(TrainingLayout):
    def batches(self, rollout, memory_keys):
        yield TensorDict({"observation": rollout["observation"]}, rollout.shape)


def test_refusals_name_the_argument_and_the_fix(ppo):
    policy, rollout = ppo
    with pytest.raises(ValueError, match="pass steps="):
        check_recurrence(policy, ppo_agent()[2], WindowLayout(8))
    with pytest.raises(ValueError, match="checks must name some of"):
        check_recurrence(policy, rollout, WindowLayout(8), checks=["ratio"])
    with pytest.raises(ValueError, match="init_key='is_first' is not in the rollout"):
        check_recurrence(policy, rollout, WindowLayout(8), init_key="is_first")
    with pytest.raises(ValueError, match="pass state_keys="):
        check_recurrence(nn.Identity(), rollout, WindowLayout(8))
    with pytest.raises(TypeError, match="layout must be a TrainingLayout"):
        check_recurrence(policy, rollout, "windows")
    with pytest.raises(TypeError, match="data must be a TorchRL env or a collected rollout"):
        check_recurrence(policy, [rollout], WindowLayout(8))
    with pytest.raises(ValueError, match="seed its sampler"):
        check_recurrence(policy, rollout, Shuffled(8), checks=["resets"])
    with pytest.raises(ValueError, match="lost the entries under '_check'"):
        check_recurrence(policy, rollout, Unmarked())
    with pytest.raises(ValueError, match="atol and rtol are both 0"):
        check_recurrence(policy, rollout, WindowLayout(8), atol=0, rtol=0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        WindowLayout(0)
    with pytest.raises(ValueError, match="second_pass must be"):
        StreamLayout(2, 4, second_pass="twice")


def test_a_check_leaves_the_carry_and_the_threads_as_it_found_them():
    torch.manual_seed(0)
    actor, critic, env = ppo_agent(nn.GRU, carry=True)
    rnn = actor.module[0][0][1]
    rnn.carried_state = TensorDict({rnn.state_keys[0]: torch.ones(3, 1, 16)}, [3])
    threads = torch.get_num_threads()
    report = check_recurrence(Seq(actor, critic), env, StreamLayout(3, 8), steps=32)
    env.close()
    assert report.ok and report["carry"].status == "pass"
    assert torch.equal(rnn.carried_state[rnn.state_keys[0]], torch.ones(3, 1, 16))
    assert torch.get_num_threads() == threads
