import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives.value.functional import generalized_advantage_estimate

from torchrl_seqchunk import boundary_gae


def make_td(reward, value, next_value, done, terminated=None, truncated=None, is_first=None):
    """A [*B, T] TensorDict from [*B, T] arrays (a trailing singleton is added)."""

    def col(x, dtype):
        return torch.as_tensor(np.asarray(x), dtype=dtype).unsqueeze(-1)

    td = TensorDict(
        {
            "state_value": col(value, torch.float64),
            ("next", "state_value"): col(next_value, torch.float64),
            ("next", "reward"): col(reward, torch.float64),
            ("next", "done"): col(done, torch.bool),
        },
        batch_size=np.asarray(reward).shape,
    )
    for key, flags in (("terminated", terminated), ("truncated", truncated)):
        if flags is not None:
            td["next", key] = col(flags, torch.bool)
    if is_first is not None:
        td["is_first"] = col(is_first, torch.bool)
    return td


def gae_loop(reward, value, next_value, terminated, stop, gamma, lmbda):
    """Per-step reference on one row: recursion cut after every `stop` step."""
    advantage = np.zeros(len(reward))
    following = 0.0
    for t in reversed(range(len(reward))):
        if stop[t]:
            following = 0.0
        delta = reward[t] + gamma * (1.0 - terminated[t]) * next_value[t] - value[t]
        following = advantage[t] = delta + gamma * lmbda * following
    return advantage


def test_truncation_bootstraps_from_final_observation():
    td = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 1]], terminated=[[0, 0]], truncated=[[0, 1]])
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([[2.52, 1.80]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        td["value_target"].squeeze(-1), torch.tensor([[3.52, 2.80]], dtype=torch.float64)
    )


def test_termination_zeroes_bootstrap():
    td = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 1]], terminated=[[0, 1]], truncated=[[0, 0]])
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([[0.9, 0.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        td["value_target"].squeeze(-1), torch.tensor([[1.9, 1.0]], dtype=torch.float64)
    )


def test_terminated_defaults_from_done_and_truncated():
    # without a terminated entry, a truncated step still bootstraps (done & ~truncated)
    td = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 1]], truncated=[[0, 1]])
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([[2.52, 1.80]], dtype=torch.float64)
    )


def test_chunk_end_bootstraps_from_next_value():
    # not done at the last step: a chunk end, bootstrapped like a truncation
    td = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 0]])
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([[2.52, 1.80]], dtype=torch.float64)
    )


def test_done_inside_a_row_equals_gae_per_episode():
    gen = torch.Generator().manual_seed(1)
    lengths = [3, 5, 4]
    reward, value, next_value = torch.randn(3, 12, generator=gen, dtype=torch.float64)
    ends = np.cumsum(lengths) - 1
    done = np.isin(np.arange(12), ends)
    terminated = np.isin(np.arange(12), ends[:1])  # episode 0 terminates, 1 truncates, 2 cut
    row = make_td([reward], [value], [next_value], [done], terminated=[terminated])
    boundary_gae(row, gamma=0.97, lmbda=0.9)
    start = 0
    for length in lengths:
        sl = slice(start, start + length)
        episode = make_td(
            [reward[sl]], [value[sl]], [next_value[sl]], [done[sl]], terminated=[terminated[sl]]
        )
        boundary_gae(episode, gamma=0.97, lmbda=0.9)
        torch.testing.assert_close(row["advantage"][:, sl], episode["advantage"])
        torch.testing.assert_close(row["value_target"][:, sl], episode["value_target"])
        start += length


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_value_stays_in_its_episode(bad):
    # two episodes in one row; the second's next value is not finite (a padding, a diverged critic):
    # the first episode's advantages are those of a row without the second (0 * inf is not 0)
    reward, value, next_value = [1.0, 1.0, 1.0, 1.0], [0.0] * 4, [0.0, 0.0, bad, 0.0]
    done = [False, True, False, True]
    row = boundary_gae(make_td([reward], [value], [next_value], [done], terminated=[done]), gamma=0.9, lmbda=0.9)
    alone = boundary_gae(make_td([reward[:2]], [value[:2]], [next_value[:2]], [done[:2]], terminated=[done[:2]]),
                         gamma=0.9, lmbda=0.9)
    torch.testing.assert_close(row["advantage"][:, :2], alone["advantage"])  # 1 + 0.81 * 1, then 1
    assert row["advantage"][0, 3].item() == 1.0 and not torch.isfinite(row["advantage"][0, 2]).item()
    # a long float32 episode whose coefficients (0.25 ** span) underflow to 0 inside it: still
    # non-finite before the inf, the episode before it finite
    steps = 300
    reward = [1.0] * steps
    reward[-1] = bad
    done = [False] * steps
    done[9] = done[-1] = True
    row = make_td([reward], [[0.0] * steps], [[0.0] * steps], [done], terminated=[done])
    for key in ("state_value", ("next", "state_value")):  # float32: 0.25 ** 76 is 0 there
        row[key] = row[key].float()
    row = boundary_gae(row, gamma=0.5, lmbda=0.5)
    assert torch.isfinite(row["advantage"][0, :10]).all() and not torch.isfinite(row["advantage"][0, 10:]).any()


def test_is_first_alone_ends_the_previous_episode():
    # a stream chunk whose stale episode rest was dropped: step 1 starts an episode
    # although step 0 is not done; step 0 then bootstraps from its own next value
    td = make_td([[1, 1, 1]], [[1, 1, 1]], [[3, 1, 1]], [[0, 0, 1]], is_first=[[1, 1, 0]])
    boundary_gae(td, gamma=0.5, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([[1.5, 0.5, 0.0]], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("batch", [(5,), (2, 3)])
def test_random_boundaries_match_per_step_loop(seed, batch):
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(1, 40))
    gamma = float(rng.uniform(0.5, 1.0))
    lmbda = [0.0, 1.0, float(rng.uniform(0.5, 1.0))][seed % 3]
    shape = (*batch, steps)
    reward, value, next_value = rng.normal(size=(3, *shape))
    terminated = rng.random(shape) < 0.1
    truncated = (rng.random(shape) < 0.1) & ~terminated
    done = terminated | truncated
    is_first = rng.random(shape) < 0.05
    td = make_td(reward, value, next_value, done, terminated, truncated, is_first)
    boundary_gae(td, gamma=gamma, lmbda=lmbda)

    stop = done.copy()
    stop[..., :-1] |= is_first[..., 1:]
    expected = np.stack(
        [
            gae_loop(*(x.reshape(-1, steps)[i] for x in (reward, value, next_value, terminated, stop)),
                     gamma, lmbda)
            for i in range(int(np.prod(batch)))
        ]
    ).reshape(shape)
    np.testing.assert_allclose(td["advantage"].squeeze(-1).numpy(), expected, atol=1e-10)
    np.testing.assert_allclose(td["value_target"].squeeze(-1).numpy(), expected + value, atol=1e-10)
    # TorchRL's loop kernel, given the same stops, agrees (its discounts are float32)
    torchrl_advantage, _ = generalized_advantage_estimate(
        gamma, lmbda, td["state_value"], td["next", "state_value"], td["next", "reward"],
        torch.as_tensor(stop).unsqueeze(-1), td["next", "terminated"],
    )
    torch.testing.assert_close(td["advantage"], torchrl_advantage, atol=1e-5, rtol=1e-5)


def test_time_only_layout():
    td = make_td([1, 1], [1, 1], [1, 2], [0, 1], terminated=[0, 0])
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    torch.testing.assert_close(
        td["advantage"].squeeze(-1), torch.tensor([2.52, 1.80], dtype=torch.float64)
    )


@pytest.mark.parametrize("gamma, lmbda", [(0.0, 0.95), (0.99, 0.0), (1e-20, 1e-20), (1.0, 1.0)])
def test_float32_three_batch_dims_and_is_init(gamma, lmbda):
    rng = np.random.default_rng(1)
    shape = (2, 3, 9)
    reward, value, next_value = rng.normal(size=(3, *shape))
    terminated = rng.random(shape) < 0.15
    truncated = (rng.random(shape) < 0.15) & ~terminated
    is_init = rng.random(shape) < 0.1
    td = make_td(reward, value, next_value, terminated | truncated, terminated, truncated)
    td = td.apply(lambda x: x.float() if x.is_floating_point() else x)
    td["is_init"] = torch.as_tensor(is_init).unsqueeze(-1)
    boundary_gae(td, gamma=gamma, lmbda=lmbda, is_first_key="is_init")

    stop = terminated | truncated
    stop[..., :-1] |= is_init[..., 1:]
    rows = [x.reshape(6, 9) for x in (reward, value, next_value, terminated, stop)]
    expected = np.stack([gae_loop(*(x[i] for x in rows), gamma, lmbda) for i in range(6)])
    assert td["advantage"].dtype == torch.float32
    np.testing.assert_allclose(td["advantage"].squeeze(-1).numpy(), expected.reshape(shape), atol=1e-5)


def test_value_target_is_detached_from_the_critic_graph():
    # values still attached to a critic graph: neither output may carry it, or a second
    # PPO epoch would backpropagate into the rollout's (freed) critic graph
    value = torch.tensor([[1.0, 1.0]], requires_grad=True)
    td = make_td([[1, 1]], [[0, 0]], [[1, 2]], [[0, 1]], terminated=[[0, 0]])
    td["state_value"] = value.unsqueeze(-1) * 1.0
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    assert not td["advantage"].requires_grad and not td["value_target"].requires_grad
    torch.testing.assert_close(td["value_target"].squeeze(-1), torch.tensor([[3.52, 2.80]]))


def test_results_take_the_dtype_of_the_values():
    td = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 1]], terminated=[[0, 0]])
    td["state_value"] = td["state_value"].float()  # next values and rewards stay float64
    boundary_gae(td, gamma=0.9, lmbda=1.0)
    assert td["advantage"].dtype == td["value_target"].dtype == torch.float32
    torch.testing.assert_close(td["advantage"].squeeze(-1), torch.tensor([[2.52, 1.80]]))


def test_custom_keys():
    td = TensorDict(
        {
            ("critic", "v"): torch.ones(1, 2, 1),
            ("boot", "v"): torch.tensor([[[1.0], [2.0]]]),
            ("next", "r"): torch.ones(1, 2, 1),
            ("next", "d"): torch.tensor([[[False], [True]]]),
            ("next", "term"): torch.tensor([[[False], [True]]]),
        },
        batch_size=[1, 2],
    )
    boundary_gae(
        td, gamma=0.9, lmbda=1.0, value_key=("critic", "v"), next_value_key=("boot", "v"),
        reward_key=("next", "r"), done_key=("next", "d"), terminated_key=("next", "term"),
        advantage_key=("out", "adv"), value_target_key=("out", "ret"),
    )
    torch.testing.assert_close(td["out", "adv"].squeeze(-1), torch.tensor([[0.9, 0.0]]))
    torch.testing.assert_close(td["out", "ret"].squeeze(-1), torch.tensor([[1.9, 1.0]]))


def test_bad_input():
    good = make_td([[1, 1]], [[1, 1]], [[1, 2]], [[0, 1]])
    with pytest.raises(ValueError, match=r"next_value_key=\('next', 'state_value'\)"):
        boundary_gae(good.exclude(("next", "state_value")), gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match=r"gamma must be in \[0.0, 1.0\]"):
        boundary_gae(good.clone(), gamma=1.5, lmbda=0.9)
    with pytest.raises(TypeError, match="lmbda must be a real number"):
        boundary_gae(good.clone(), gamma=0.9, lmbda="0.9")
    bad_dtype = good.clone()
    bad_dtype["next", "done"] = bad_dtype["next", "done"].float()
    with pytest.raises(TypeError, match=r"done_key=\('next', 'done'\) has dtype torch.float32"):
        boundary_gae(bad_dtype, gamma=0.9, lmbda=0.9)
    bad_shape = good.clone()
    bad_shape["state_value"] = torch.ones(1, 2, 3)
    with pytest.raises(ValueError, match=r"value_key='state_value' has shape \(1, 2, 3\)"):
        boundary_gae(bad_shape, gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="batch_size=()"):
        boundary_gae(good[0, 0], gamma=0.9, lmbda=0.9)
    with pytest.raises(TypeError, match="tensordict must be a TensorDict"):
        boundary_gae({"state_value": torch.ones(2, 1)}, gamma=0.9, lmbda=0.9)
    # integer values: the rewards cast to their dtype would be truncated (0.5 -> 0)
    integer = good.clone()
    integer["state_value"] = integer["state_value"].long()
    with pytest.raises(TypeError, match=r"value_key='state_value' has dtype torch.int64; values must be floating"):
        boundary_gae(integer, gamma=0.9, lmbda=0.9)
    # integer rewards (or next values) with floating values are exact: the same advantages
    expected = boundary_gae(good.clone(), gamma=0.9, lmbda=0.9)["advantage"]
    for key in (("next", "reward"), ("next", "state_value")):
        exact = good.clone()
        exact[key] = exact[key].long()
        torch.testing.assert_close(boundary_gae(exact, gamma=0.9, lmbda=0.9)["advantage"], expected)



def test_empty_time_dimension_is_refused_and_empty_batch_runs():
    empty_time = make_td(np.zeros((2, 0)), np.zeros((2, 0)), np.zeros((2, 0)), np.zeros((2, 0)))
    with pytest.raises(ValueError, match=r"batch_size=\(2, 0\), an empty time dimension"):
        boundary_gae(empty_time, gamma=0.9, lmbda=0.9)
    empty_batch = make_td(np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 3)))
    assert boundary_gae(empty_batch, gamma=0.9, lmbda=0.9)["advantage"].shape == (0, 3, 1)
