import pytest
import torch
from tensordict import TensorDict

from torchrl_seqchunk import make_windows


def rollout_from_episodes(lengths_per_row, *, truncate_last=False):
    """[num_envs, T] rollout: each row concatenates episodes; "step" holds e * T + t."""
    steps = sum(lengths_per_row[0])
    num_envs = len(lengths_per_row)
    done = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    truncated = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
    for e, lengths in enumerate(lengths_per_row):
        ends = torch.tensor(lengths).cumsum(0) - 1
        done[e, ends] = True
        if truncate_last:
            truncated[e, ends[-1]] = True
    return TensorDict(
        {
            "step": torch.arange(num_envs * steps).view(num_envs, steps),
            "recurrent_state": torch.randn(num_envs, steps, 4),
            ("next", "done"): done,
            ("next", "terminated"): done & ~truncated,
            ("next", "truncated"): truncated,
        },
        batch_size=[num_envs, steps],
    )


def test_windows_hold_consecutive_steps_of_one_row():
    rollout = rollout_from_episodes([[3, 4], [2, 5]])  # T = 7
    windows = make_windows(rollout, 3, stride=2)
    # starts 0, 2, 4 per row; window n = e * 3 + j
    assert windows.batch_size == torch.Size([6, 3])
    expected = torch.tensor(
        [[0, 1, 2], [2, 3, 4], [4, 5, 6], [7, 8, 9], [9, 10, 11], [11, 12, 13]]
    )
    assert torch.equal(windows["step"], expected)
    torch.testing.assert_close(
        windows["recurrent_state"], rollout["recurrent_state"].reshape(14, 4)[expected]
    )


def test_reset_flags_by_hand():
    # row 0: episodes [3, 4]; row 1: [2, 5]
    rollout = rollout_from_episodes([[3, 4], [2, 5]])
    flags = make_windows(rollout, 3)["is_first"].squeeze(-1).int()
    expected = torch.tensor(
        [
            [1, 0, 0], [1, 0, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0],  # row 0, starts 0..4
            [1, 0, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0],  # row 1
        ]
    )
    assert torch.equal(flags, expected)


def test_truncation_and_rollout_is_first_also_reset():
    rollout = rollout_from_episodes([[6]])
    rollout["next", "done"][0, 1] = True
    rollout["next", "truncated"][0, 1] = True
    rollout["is_first"] = torch.zeros(1, 6, 1, dtype=torch.bool)
    rollout["is_first"][0, 4] = True  # an episode start the flags of step 3 do not show
    flags = make_windows(rollout, 6)["is_first"].squeeze(-1).int()
    assert torch.equal(flags, torch.tensor([[1, 0, 1, 0, 1, 0]]))


def test_count_weights_sum_to_one_per_step():
    rollout = rollout_from_episodes([[5, 7, 4]])
    windows = make_windows(rollout, 4)
    total = torch.zeros(16).index_add_(0, windows["step"].reshape(-1), windows["count_weight"].reshape(-1))
    torch.testing.assert_close(total, torch.ones(16))
    # hand count: steps 0..2 and 13..15 lie in 1, 2, 3 windows, the rest in 4
    first = windows["count_weight"][0].squeeze(-1)
    torch.testing.assert_close(first, torch.tensor([1.0, 1 / 2, 1 / 3, 1 / 4]))


def test_stride_leaves_tail_uncovered():
    # T = 11: starts 0, 3, 6; step 10 is in no window
    windows = make_windows(rollout_from_episodes([[11]]), 4, stride=3)
    assert torch.equal(
        windows["step"], torch.tensor([[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]])
    )
    torch.testing.assert_close(
        windows["count_weight"].squeeze(-1),
        torch.tensor([[1, 1, 1, 0.5], [0.5, 1, 1, 0.5], [0.5, 1, 1, 1]]),
    )


def test_rows_ending_mid_episode_are_chunk_ends():
    # the last step of each row is not done: windows stop there, no crossing into row 1
    rollout = rollout_from_episodes([[2, 4], [6]])
    rollout["next", "done"][:, -1] = False
    windows = make_windows(rollout, 4)
    assert torch.equal(windows["step"][:3, -1], torch.tensor([3, 4, 5]))
    assert torch.equal(windows["step"][3], torch.tensor([6, 7, 8, 9]))
    assert not windows["is_first"][3:, 1:].any()


def test_several_memory_keys():
    rollout = rollout_from_episodes([[4]])
    rollout["critic_state"] = torch.zeros(1, 4, 2, 3)
    windows = make_windows(rollout, 2, memory_key=["recurrent_state", "critic_state"])
    assert windows["critic_state"].shape == (3, 2, 2, 3)
    with pytest.raises(ValueError, match=r"memory_key=\('actor', 'h'\) is not in the rollout"):
        make_windows(rollout, 2, memory_key=["recurrent_state", ("actor", "h")])


def test_bad_input():
    rollout = rollout_from_episodes([[3, 4]])
    with pytest.raises(ValueError, match=r"window must be in \[1, 7\], got 0"):
        make_windows(rollout, 0)
    with pytest.raises(ValueError, match=r"window must be in \[1, 7\], got 8"):
        make_windows(rollout, 8)
    with pytest.raises(ValueError, match="stride must be >= 1, got 0"):
        make_windows(rollout, 2, stride=0)
    with pytest.raises(TypeError, match="window must be an int"):
        make_windows(rollout, 2.0)
    with pytest.raises(ValueError, match="memory_key='memory' is not in the rollout"):
        make_windows(rollout, 2, memory_key="memory")
    with pytest.raises(ValueError, match=r"expected \[num_envs, T\]"):
        make_windows(rollout[0], 2)
    with pytest.raises(ValueError, match=r"done_key=\('next', 'done'\) is not in the rollout"):
        make_windows(rollout.exclude(("next", "done")), 2)
    float_flags = rollout.clone()
    float_flags["next", "truncated"] = float_flags["next", "truncated"].float()
    with pytest.raises(TypeError, match=r"truncated_key=\('next', 'truncated'\) must be bool"):
        make_windows(float_flags, 2)
    # a non-bool episode-start flag is refused, not silently cast (0.5 would become True)
    soft_first = rollout.clone()
    soft_first["is_first"] = torch.full((1, 7, 1), 0.5)
    with pytest.raises(TypeError, match="is_first_key='is_first' must be bool of shape"):
        make_windows(soft_first, 2)
    with pytest.raises(TypeError, match="rollout must be a TensorDict"):
        make_windows({"step": torch.zeros(1, 3)}, 2)


def test_a_rollout_of_no_env_gives_no_window():
    windows = make_windows(rollout_from_episodes([[3, 4]])[:0], 2)
    assert windows.batch_size == (0, 2)
    assert windows["is_first"].shape == windows["count_weight"].shape == (0, 2, 1)



def test_collector_rollout_flags_and_stored_memory():
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs import (
        Compose,
        GymEnv,
        InitTracker,
        SerialEnv,
        StepCounter,
        TransformedEnv,
    )

    from torchrl_seqchunk import ResetRNN

    rnn = ResetRNN(nn.GRUCell(4, 8), in_key="observation", out_key="h", state_key="mem", carry=False)

    def make_env():
        return TransformedEnv(GymEnv("CartPole-v1"), Compose(InitTracker(init_key="is_first"), StepCounter(5)))

    env = TransformedEnv(SerialEnv(2, make_env), rnn.make_tensordict_primer())
    # the action depends on the memory (one-hot, as GymEnv encodes CartPole's actions)
    head = TensorDictModule(lambda h: nn.functional.one_hot((h[..., 0] > 0).long(), 2), ["h"], ["action"])
    collector = Collector(
        env, TensorDictSequential(rnn, head), frames_per_batch=36, total_frames=36,
        auto_register_policy_transforms=False,  # InitTracker sits in the workers
    )
    rollout = next(iter(collector))  # [2, 18], episodes of at most 5 steps
    collector.shutdown()
    windows = make_windows(rollout, 4, stride=2, memory_key="mem")
    index = torch.arange(0, 15, 2)[:, None] + torch.arange(4)  # [S=8, W=4]
    # reset slots: slot 0, and wherever the previous step ended an episode
    previous_done = torch.cat([torch.ones(2, 1, dtype=torch.bool), rollout["next", "done"][:, :-1, 0]], 1)
    expected = previous_done[:, index].clone()
    expected[..., 0] = True
    assert previous_done[:, 1:].any()
    assert torch.equal(windows["is_first"].squeeze(-1), expected.reshape(-1, 4))
    # the stored memory is the one the agent acted with: zeros at an episode's first step,
    # the previous step's next memory inside an episode
    memory, starts = windows["mem"], previous_done[:, index].reshape(-1, 4)
    assert memory[starts].abs().sum() == 0
    following = rollout["next", "mem"][:, index].reshape(-1, 4, 8)
    torch.testing.assert_close(memory[:, 1:][~starts[:, 1:]], following[:, :-1][~starts[:, 1:]])


def test_a_tuple_of_keys_and_numpy_integers():
    import numpy as np

    rollout = rollout_from_episodes([[3, 4]])
    rollout["critic", "h"] = torch.zeros(1, 7, 2)
    keys = ("recurrent_state", ("critic", "h"))  # a tuple holding a tuple: two keys
    windows = make_windows(rollout, np.int64(3), stride=np.int32(2), memory_key=keys)
    assert windows.batch_size == (3, 3)  # starts 0, 2, 4 of T = 7
    assert windows["step"].tolist() == [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    with pytest.raises(ValueError, match=r"memory_key=\('critic', 'x'\) is not in the rollout"):
        make_windows(rollout, 3, memory_key=("recurrent_state", ("critic", "x")))
