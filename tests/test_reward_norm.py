"""ReturnScaledReward against a per-step numpy reference of the discounted-return scaling;
RunningObservationNorm against TorchRL's VecNormV2 and a numpy count of the rows reset."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import VecNormV2
from torchrl.data import Bounded, Composite, Unbounded

from torchrl_seqchunk import ReturnScaledReward, RunningObservationNorm


def reference(rewards, dones, gamma, clip, eps=1e-8):
    """VecNormalize's reward rule written step by step: return, batch-moment merge, scale, reset."""
    mean, var, count = 0.0, 1.0, 1e-4
    returns, out = np.zeros(rewards.shape[1]), []
    for r, d in zip(rewards, dones):
        returns = returns * gamma + r
        n, m, v = len(returns), returns.mean(), returns.var()
        total = count + n
        delta = m - mean
        var = (var * count + v * n + delta**2 * count * n / total) / total
        mean, count = mean + delta * n / total, total
        out.append(np.clip(r / np.sqrt(var + eps), -clip, clip))
        returns[d] = 0.0
    return np.stack(out)


def test_matches_the_per_step_reference_with_resets_and_clipping():
    rng = np.random.default_rng(0)
    rewards = rng.normal(1.0, 2.0, size=(40, 3))
    dones = rng.random((40, 3)) < 0.15
    transform = ReturnScaledReward(gamma=0.9, clip=3.0)
    got = []
    for r, d in zip(rewards, dones):
        next_td = TensorDict({"reward": torch.tensor(r).unsqueeze(-1), "done": torch.tensor(d).unsqueeze(-1)}, [3])
        got.append(transform._step(TensorDict({}, [3]), next_td)["reward"].squeeze(-1).numpy())
    expected = reference(rewards, dones, 0.9, 3.0)
    np.testing.assert_allclose(np.stack(got), expected, rtol=1e-6)
    assert (np.abs(expected) == 3.0).any() and (np.abs(expected) < 3.0).any()  # both regimes hit


def test_constant_reward_stays_positive_and_statistics_resume():
    # CartPole's reward: 1 per step; VecNormV2 would centre it to 0
    transform = ReturnScaledReward(gamma=0.5)
    step = lambda t: t._step(TensorDict({}, [2]), TensorDict({"reward": torch.ones(2, 1), "done": torch.zeros(2, 1, dtype=torch.bool)}, [2]))["reward"]
    for _ in range(20):
        scaled = step(transform)
    # the return tends to 1 / (1 - 0.5) = 2 for both envs: var shrinks, the reward grows but is clipped at 10
    assert (scaled > 0).all()
    resumed = ReturnScaledReward(gamma=0.5)
    resumed.load_state_dict(transform.state_dict())
    assert resumed.count.item() == pytest.approx(40 + 1e-4)


@pytest.mark.parametrize("kwargs, match", [({"gamma": 1.5}, "gamma"), ({"clip": 0}, "clip"), ({"eps": -1}, "eps")])
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReturnScaledReward(**kwargs)


def test_a_reset_without_done_starts_a_new_return_and_bad_done_shapes_are_named():
    gamma = 0.5
    transform = ReturnScaledReward(gamma=gamma)
    step = lambda: transform._step(TensorDict({}, [2]), TensorDict(
        {"reward": torch.ones(2, 1), "done": torch.zeros(2, 1, dtype=torch.bool)}, [2]))
    step(), step()
    assert transform._return.squeeze(-1).tolist() == [1.5, 1.5]  # 1, then 0.5 * 1 + 1
    # a collector resetting env 0 with no done step (reset_at_each_iter=True)
    transform._reset(TensorDict({"_reset": torch.tensor([[True], [False]])}, [2]), TensorDict({}, [2]))
    step()
    assert transform._return.squeeze(-1).tolist() == [1.0, 1.75]
    with pytest.raises(ValueError, match=r"done_key 'done' has shape \[2, 2\], the reward \[2, 1\]"):
        transform._step(TensorDict({}, [2]), TensorDict(
            {"reward": torch.ones(2, 1), "done": torch.zeros(2, 2, dtype=torch.bool)}, [2]))


def _observations(steps, envs, seed=0):
    rng = np.random.default_rng(seed)  # features of unlike scales, one nearly constant
    scale = np.array([0.01, 1.0, 100.0])
    return torch.tensor(rng.normal(3.0, 1.0, size=(steps, envs, 3)) * scale, dtype=torch.float32)


@pytest.mark.filterwarnings("ignore:Support of VecNormV2")
def test_observation_norm_is_vecnormv2_on_full_resets_and_steps():
    obs = _observations(30, 4)
    ours = RunningObservationNorm()
    theirs = VecNormV2(in_keys=["observation"], decay=1.0, reduce_batch_dims=True)
    for t, o in enumerate(obs):
        data = lambda: TensorDict({"observation": o.clone()}, [4])
        if t % 10 == 0:  # a reset of every env: no "_reset" mask
            got, want = ours._reset(TensorDict({}, [4]), data()), theirs._reset(TensorDict({}, [4]), data())
        else:
            got, want = ours._step(TensorDict({}, [4]), data()), theirs._step(TensorDict({}, [4]), data())
        torch.testing.assert_close(got["observation"], want["observation"], rtol=1e-4, atol=1e-4)
    assert ours.count.item() == 120


def test_observation_norm_counts_only_the_envs_reset_and_resumes():
    obs, resets = _observations(12, 3, seed=1), torch.rand(12, 3, generator=torch.Generator().manual_seed(0)) < 0.4
    norm, seen, got = RunningObservationNorm(), [], []
    for t, (o, r) in enumerate(zip(obs, resets)):
        if t % 2:  # a partial reset: rows not reset are the env's current data, not counted
            out = norm._reset(TensorDict({"_reset": r.unsqueeze(-1)}, [3]), TensorDict({"observation": o}, [3]))
            seen.extend(o[r].numpy())
        else:
            out = norm._step(TensorDict({}, [3]), TensorDict({"observation": o}, [3]))
            seen.extend(o.numpy())
        counted = np.stack(seen).astype(np.float64)  # the reference: every counted row so far
        want = (o.numpy() - counted.mean(0)) / np.maximum(counted.std(0), 1e-4)
        np.testing.assert_allclose(out["observation"].numpy(), want, rtol=1e-5, atol=1e-5)
    assert norm.count.item() == len(seen) < 12 * 3
    resumed = RunningObservationNorm()
    resumed.load_state_dict(norm.state_dict())
    o = obs[0]
    torch.testing.assert_close(resumed._step(TensorDict({}, [3]), TensorDict({"observation": o}, [3]))["observation"],
                               norm._step(TensorDict({}, [3]), TensorDict({"observation": o}, [3]))["observation"])
    with pytest.raises(ValueError, match=r"'observation' has features \[2\], the statistics \[3\]"):
        norm._step(TensorDict({}, [3]), TensorDict({"observation": torch.zeros(3, 2)}, [3]))
    with pytest.raises(ValueError, match="eps must be > 0"):
        RunningObservationNorm(eps=0)
    with pytest.raises(ValueError, match="clip must be > 0"):
        RunningObservationNorm(clip=0.0)


def test_observation_norm_clips_a_value_a_constant_feature_never_took():
    # feature 0 constant at 2.0 (std 0, at the floor 1e-4), feature 1 alternating 0, 4 (mean 2, std 2)
    seen = torch.tensor([[2.0, 0.0], [2.0, 4.0]] * 3)
    plain, clipped = RunningObservationNorm(), RunningObservationNorm(clip=10.0)
    for norm in (plain, clipped):
        norm.normalize(seen, batch_dims=1)
    new = torch.tensor([[3.0, 4.0]])  # by hand: (3 - 2) / 1e-4 = 1e4, (4 - 2) / 2 = 1 before the merge
    frozen_plain, frozen_clipped = plain.frozen_copy(), clipped.frozen_copy()
    torch.testing.assert_close(frozen_plain.normalize(new), torch.tensor([[1e4, 1.0]]))
    torch.testing.assert_close(frozen_clipped.normalize(new), torch.tensor([[10.0, 1.0]]))
    assert frozen_clipped.count.item() == 6 and frozen_clipped.clip == 10.0  # frozen: nothing merged
    torch.testing.assert_close(frozen_clipped.mean, torch.tensor([2.0, 2.0], dtype=torch.float64))
    clipped.normalize(new)  # the original goes on merging; its copy does not follow
    assert clipped.count.item() == 7 and frozen_clipped.count.item() == 6
    with pytest.raises(ValueError, match="no statistics to normalize"):
        RunningObservationNorm(frozen=True).normalize(new)
    with pytest.raises(ValueError, match="has seen no observation"):
        RunningObservationNorm().frozen_copy()
    counted_none = RunningObservationNorm()
    counted_none.normalize(new, counted=torch.tensor([False]))  # shaped, but nothing counted yet
    with pytest.raises(ValueError, match="has seen no observation"):
        counted_none.frozen_copy()
    with pytest.raises(TypeError, match="frozen must be a bool"):
        RunningObservationNorm(frozen="False")


def test_observation_norm_refuses_integer_observations_and_clones_its_statistics():
    norm = RunningObservationNorm(clip=3.0)
    with pytest.raises(TypeError, match="torch.uint8: normalized observations are real numbers"):
        norm.normalize(torch.tensor([[0, 10, 20]], dtype=torch.uint8))
    norm.normalize(torch.tensor([[0.0], [2.0]]))  # mean 1, std 1
    twin = norm.clone()
    assert twin.clip == 3.0 and not twin.frozen and twin.count.item() == 2
    twin.normalize(torch.tensor([[10.0]]))  # the clone merges into its own statistics only
    assert twin.count.item() == 3 and norm.count.item() == 2 and norm.mean.item() == 1.0
    spec = norm.transform_observation_spec(Composite(observation=Unbounded(shape=(1,))))["observation"]
    assert isinstance(spec, Bounded) and spec.space.high.item() == 3.0 and spec.space.low.item() == -3.0


def test_a_nan_or_inf_is_refused_before_it_reaches_the_statistics():
    norm = RunningObservationNorm()
    norm.normalize(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))  # mean [1, 2], var [1, 1]
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"'observation' holds 1 NaN or infinite value\(s\) in this batch of 4"):
            norm.normalize(torch.tensor([[0.0, bad], [2.0, 3.0]]))
        for key, value in norm.state_dict().items():
            torch.testing.assert_close(value, before[key])
    # a row not counted (a partial reset's envs not reset) may hold anything: it is not merged
    out = norm.normalize(torch.tensor([[float("nan"), 0.0], [3.0, 2.0]]), counted=torch.tensor([False, True]))
    assert norm.count.item() == 3 and torch.isnan(out[0, 0]) and out[1].isfinite().all()
    with pytest.raises(ValueError, match=r"counted has shape \[3\]; it must be one flag per env row, \[2\]"):
        norm.normalize(torch.zeros(2, 2), counted=torch.tensor([True, False, True]))

    scaler = ReturnScaledReward(gamma=0.9)
    done = torch.zeros(2, 1, dtype=torch.bool)
    scaler.scale(torch.ones(2, 1), done)
    with pytest.raises(ValueError, match="discounted return of reward_key 'reward' holds 1 NaN"):
        scaler.scale(torch.tensor([[1.0], [float("nan")]]), done)
    assert scaler.count.item() == pytest.approx(2 + 1e-4)  # nothing merged
    # the returns were not advanced by the refused step: the next one continues from G = 1
    fresh = ReturnScaledReward(gamma=0.9)
    fresh.scale(torch.ones(2, 1), done)
    torch.testing.assert_close(scaler.scale(torch.ones(2, 1), done), fresh.scale(torch.ones(2, 1), done))


def test_a_refused_step_of_another_batch_shape_keeps_the_returns_and_low_precision_returns_do_not_overflow():
    refused, clean = ReturnScaledReward(gamma=0.9), ReturnScaledReward(gamma=0.9)
    going_on = torch.zeros(3, 1, dtype=torch.bool)
    for scaler in (refused, clean):
        scaler.scale(torch.ones(3, 1), going_on)
    with pytest.raises(ValueError, match="holds 1 NaN"):
        refused.scale(torch.tensor([[float("nan")], [1.0]]), torch.zeros(2, 1, dtype=torch.bool))
    torch.testing.assert_close(refused.scale(torch.ones(3, 1), going_on), clean.scale(torch.ones(3, 1), going_on))
    torch.testing.assert_close(refused.var, clean.var)
    # float16 rewards of 1000: the return reaches 1000 / (1 - 0.99) = 1e5, past float16's 65504
    half = ReturnScaledReward(gamma=0.99)
    for _ in range(200):
        out = half.scale(torch.full((2, 1), 1000.0, dtype=torch.float16), going_on[:2])
    assert out.dtype == torch.float16 and out.isfinite().all() and half.var.isfinite()


def test_values_too_large_for_their_variance_are_named_and_a_frozen_transform_checks_its_mask():
    norm = RunningObservationNorm()
    with pytest.raises(ValueError, match=r"holds values too large for their variance in torch.float64 \(up to 1e\+200\)"):
        norm.normalize(torch.tensor([[1e200], [-1e200]], dtype=torch.float64))
    assert norm.count.item() == 0
    norm.normalize(torch.tensor([[0.0], [2.0]]))
    with pytest.raises(ValueError, match=r"counted has shape \[3\]"):
        norm.frozen_copy().normalize(torch.zeros(2, 1), counted=torch.tensor([True, False, True]))


def test_a_float16_reward_whose_scale_overflows_float16_is_scaled_in_float32():
    half, single = ReturnScaledReward(gamma=0.99), ReturnScaledReward(gamma=0.99)
    done = torch.zeros(4, 1, dtype=torch.bool)
    for _ in range(300):  # the return's std passes 65504, float16's largest value
        out = half.scale(torch.full((4, 1), 5000.0, dtype=torch.float16), done)
        want = single.scale(torch.full((4, 1), 5000.0), done)
    assert out.dtype == torch.float16 and float(out[0]) > 0
    torch.testing.assert_close(out.float(), want, rtol=1e-3, atol=0.0)
    with pytest.raises(ValueError, match="eps must be finite"):
        ReturnScaledReward(eps=float("inf"))
