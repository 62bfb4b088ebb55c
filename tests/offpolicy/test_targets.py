"""boundary_nstep_targets: hand-computed values at every boundary kind, and a per-episode loop."""
import pytest
import torch
from tensordict import TensorDict

from torchrl_seqchunk import boundary_nstep_targets


def chunk(reward, next_value, *, done=(), terminated=(), truncated=(), is_first=(0,)):
    """One row of len(reward) steps; flags given as the steps where they are True."""
    steps = len(reward)

    def flags(where):
        out = torch.zeros(1, steps, 1, dtype=torch.bool)
        out[0, list(where), 0] = True
        return out

    return TensorDict({
        ("next", "reward"): torch.tensor(reward, dtype=torch.float64).view(1, steps, 1),
        ("next", "state_value"): torch.tensor(next_value, dtype=torch.float64).view(1, steps, 1),
        ("next", "done"): flags(set(done) | set(terminated) | set(truncated)),
        ("next", "terminated"): flags(terminated),
        ("next", "truncated"): flags(truncated),
        "is_first": flags(is_first),
    }, batch_size=[1, steps])


def targets(td, **kwargs):
    return boundary_nstep_targets(td, gamma=0.5, **kwargs)["value_target"].view(-1).tolist()


def test_termination_stops_without_bootstrap():
    td = chunk([1.0, 2.0, 4.0], [10.0, 10.0, 10.0], terminated=[1], is_first=[0, 2])
    # t=0: 1 + .5*2, no bootstrap; t=1: 2; t=2 (chunk end): 4 + .5*10
    assert targets(td, n_steps=3) == [2.0, 2.0, 9.0]


def test_truncation_bootstraps_from_the_final_observation():
    td = chunk([1.0, 2.0, 4.0], [10.0, 7.0, 3.0], truncated=[1], is_first=[0, 2])
    # t=0: 1 + .5*2 + .25*7; t=1: 2 + .5*7; t=2: 4 + .5*3 (the next episode's own value)
    assert targets(td, n_steps=3) == [3.75, 5.5, 5.5]


def test_chunk_end_bootstraps_from_the_next_observation():
    td = chunk([1.0, 2.0], [10.0, 6.0])
    # no flag at the last step: t=0: 1 + .5*2 + .25*6; t=1: 2 + .5*6
    assert targets(td, n_steps=3) == [3.5, 5.0]


def test_is_first_stops_the_sum_even_without_a_done_flag():
    # a stream dropped the rest of an overwritten episode: step 2 starts one, step 1 not done
    td = chunk([1.0, 2.0, 4.0], [10.0, 8.0, 6.0], is_first=[0, 2])
    assert targets(td, n_steps=3) == [1.0 + 1.0 + 0.25 * 8.0, 2.0 + 4.0, 4.0 + 3.0]


def test_is_first_at_the_first_step_and_n_limit():
    td = chunk([1.0, 2.0, 4.0, 8.0], [1.0, 2.0, 3.0, 4.0], is_first=[0])
    # n = 2 inside one episode: r_t + .5 r_{t+1} + .25 V'_{t+1}
    assert targets(td, n_steps=2) == [1 + 1 + 0.5, 2 + 2 + 0.75, 4 + 4 + 1.0, 8 + 2.0]
    assert targets(td, n_steps=1) == [1 + 0.5, 2 + 1.0, 4 + 1.5, 8 + 2.0]


def per_episode_reference(reward, next_value, done, terminated, is_first, gamma, n):
    """Splits every row into episodes and sums each step's n-step target by hand."""
    rows, steps = reward.shape
    out = torch.zeros(rows, steps, dtype=torch.float64)
    for b in range(rows):
        starts = [0] + [t for t in range(1, steps) if is_first[b, t] or done[b, t - 1]]
        for first, stop in zip(starts, starts[1:] + [steps]):
            last = stop - 1  # the episode piece's last step in this row
            for t in range(first, stop):
                end = min(t + n - 1, last)
                total = sum(gamma ** (j - t) * reward[b, j] for j in range(t, end + 1))
                if not terminated[b, end]:
                    total += gamma ** (end - t + 1) * next_value[b, end]
                out[b, t] = total
    return out


@pytest.mark.parametrize("n", [1, 3, 5, 17, 10**6])  # n past the row's length: every window ends there
def test_matches_a_per_episode_loop(n):
    g = torch.Generator().manual_seed(n)
    rows, steps = 6, 17
    reward = torch.randn(rows, steps, generator=g, dtype=torch.float64)
    next_value = torch.randn(rows, steps, generator=g, dtype=torch.float64)
    done = torch.rand(rows, steps, generator=g) < 0.2
    terminated = done & (torch.rand(rows, steps, generator=g) < 0.5)
    is_first = torch.zeros(rows, steps, dtype=torch.bool)
    is_first[:, 1:] = done[:, :-1]
    is_first[:, 0] = torch.rand(rows, generator=g) < 0.5
    is_first |= torch.rand(rows, steps, generator=g) < 0.05  # starts with no done before
    td = TensorDict({
        ("next", "reward"): reward.unsqueeze(-1), ("next", "state_value"): next_value.unsqueeze(-1),
        ("next", "done"): done.unsqueeze(-1), ("next", "terminated"): terminated.unsqueeze(-1),
        ("next", "truncated"): (done & ~terminated).unsqueeze(-1), "is_first": is_first.unsqueeze(-1),
    }, batch_size=[rows, steps])
    got = boundary_nstep_targets(td, gamma=0.9, n_steps=n)["value_target"].squeeze(-1)
    want = per_episode_reference(reward, next_value, done, terminated, is_first, 0.9, n)
    torch.testing.assert_close(got, want)


def test_no_gradient_reaches_the_targets_from_rewards_or_values():
    td = chunk([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    td["next", "reward"].requires_grad_(True)  # e.g. rewards of a learned model
    td["next", "state_value"].requires_grad_(True)
    assert not boundary_nstep_targets(td, gamma=0.5, n_steps=2)["value_target"].requires_grad


def test_without_terminated_key_done_and_not_truncated_terminates():
    td = chunk([1.0, 2.0, 4.0], [10.0, 7.0, 3.0], truncated=[1], is_first=[0, 2])
    del td["next", "terminated"]
    assert targets(td, n_steps=3) == [3.75, 5.5, 5.5]


def test_bad_inputs_are_named():
    td = chunk([1.0], [1.0])
    with pytest.raises(ValueError, match="n_steps"):
        boundary_nstep_targets(td, gamma=0.5, n_steps=0)
    with pytest.raises(ValueError, match="gamma"):
        boundary_nstep_targets(td, gamma=1.5)
    with pytest.raises(ValueError, match="next_value_key"):
        boundary_nstep_targets(td.exclude(("next", "state_value")), gamma=0.5)
    with pytest.raises(TypeError, match="done_key"):
        td["next", "done"] = td["next", "done"].float()
        boundary_nstep_targets(td, gamma=0.5)
    with pytest.raises(TypeError, match="TensorDict"):
        boundary_nstep_targets({"a": 1}, gamma=0.5)
    integer = chunk([1.0], [1.0])
    integer["next", "state_value"] = integer["next", "state_value"].long()
    with pytest.raises(TypeError, match="next_value_key=.* has dtype torch.int64"):
        boundary_nstep_targets(integer, gamma=0.5)
