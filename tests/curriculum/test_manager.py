"""ResetManager: the move rule against a per-index loop, assignment, state, argument checks."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrl_seqchunk import Demo, ResetManager, ReverseCurriculum


def test_move_rule_first_index_reaching_mass():
    manager = ResetManager(1000, 8, window=32, move_threshold=0.1)  # mass 3.2
    manager.record(torch.arange(500, 504), torch.ones(4, dtype=torch.bool))
    assert manager.update() == 503  # cumsum: 1, 2, 3 (< 3.2), 4 at index 503


def test_move_rule_nudges_forward_when_mass_never_reached():
    manager = ResetManager(1000, 8, window=32, nudge=100, maximum=500)
    manager.record(torch.tensor([500, 496, 492]), torch.zeros(3, dtype=torch.bool))
    assert manager.update() == 600
    assert manager.update() == 700
    manager.maximum = 950
    assert manager.update() == 999  # capped at the demo's last index


def test_move_rule_moves_forward_only_by_the_nudge():
    manager = ResetManager(1000, 8, window=32, maximum=400, nudge=100)
    manager.record(torch.arange(500, 504), torch.ones(4, dtype=torch.bool))
    assert manager.update() == 500  # mass reached at 503 only, above 400: nudged, not moved to 503


def test_rates_above_the_maximum_do_not_hold_it_after_a_collapse():
    # window 4, mass 0.5 * 4 = 2: points 9..12 succeed (rates 1), the maximum moves back to 10
    # (cumsum 1, 2 at 9, 10); then every episode from 10..7 fails
    manager = ResetManager(20, 4, window=4, move_threshold=0.5, nudge=4, maximum=12)
    manager.record([12, 11, 10, 9], [True] * 4)
    assert manager.update() == 10
    manager.record([10, 9, 8, 7], [False] * 4)
    # rates now 0 at 7..10, 1 at 11, 12: the cumsum reaches 2 at 12 > 10, so nudged by 4 to 14
    # (the stale rates at 11 and 12 would otherwise hold the maximum at 10 for good)
    assert manager.update() == 14
    assert manager.rates[11].item() == 1.0 and manager.rates[10].item() == 0.0


def test_success_rate_is_fraction_of_the_batch():
    manager = ResetManager(1000, 4, window=10, move_threshold=0.1)  # mass 1.0
    manager.record([700, 700, 700, 700], [True, False, True, True])
    manager.record([710, 710], [True, True])
    manager.update()
    assert manager.rates[700].item() == 0.75  # the last episode alone would give 1.0
    assert manager.rates[710].item() == 1.0
    # cumsum 0.75 at 700 (1.0 there would have stopped at 700), 1.75 at 710
    assert manager.maximum == 710
    assert manager.last_success_rate == 5 / 6
    # a new batch overwrites the rate of its points only
    manager.record([700, 700], [False, False])
    manager.update()
    assert manager.rates[700].item() == 0.0 and manager.rates[710].item() == 1.0


def reference_move(rates, maximum, threshold, window, nudge, last):
    """The move rule as a plain loop over indices: the mass of index i is that of min(window, i + 1) points."""
    total = 0.0
    for index, rate in enumerate(rates):
        total += rate
        if total >= threshold * min(window, index + 1) - 1e-9:
            return index if index <= maximum else min(maximum + nudge, last)
    return min(maximum + nudge, last)


@settings(max_examples=50, deadline=None)
@given(
    episodes=st.lists(st.tuples(st.integers(0, 199), st.booleans()), min_size=1, max_size=40),
    maximum=st.integers(0, 199),
    window=st.integers(1, 8),
)
def test_update_matches_a_per_index_loop(episodes, maximum, window):
    manager = ResetManager(200, 8, window=window, move_threshold=0.5, nudge=7, maximum=maximum)
    points, successes = zip(*episodes)
    manager.record(list(points), list(successes))
    wins, counts = [0] * 200, [0] * 200
    for point, success in episodes:
        counts[point] += 1
        wins[point] += success
    rates = [w / c if c else 0.0 for w, c in zip(wins, counts)]
    assert manager.update() == reference_move(rates, maximum, 0.5, window, 7, 199)


def test_the_maximum_reaches_the_demos_start():
    # mass 0.5 * 4 = 2 can never be reached at index 0 or 1 (one and two rates of at most 1 each):
    # the full mass left the maximum at 1 or nudged it forward
    manager = ResetManager(100, 4, window=4, move_threshold=0.5, maximum=1)
    manager.record([1, 0, 0, 0], [True, True, True, False])  # rate 2/3 at 0 >= 0.5 * 1
    assert manager.update() == 0
    manager = ResetManager(100, 4, window=4, move_threshold=0.5, maximum=1)
    manager.record([1, 0, 0], [True, True, False])  # 0.5 at 0 reaches it too
    assert manager.update() == 0
    manager = ResetManager(100, 4, window=4, move_threshold=0.5, maximum=3)
    manager.record([3, 2, 1, 0], [True, True, True, False])  # index 1: 0 + 1 >= 0.5 * 2
    assert manager.update() == 1


def test_an_empty_record_is_no_episode():
    manager = ResetManager(100, 2, window=2, decay=0.5)
    manager.record([50], [True])
    manager.update()
    manager.record([], [])  # plain lists: no dtype to check, nothing recorded
    manager.record(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool))
    assert manager.num_pending == 0
    manager.update()  # nothing folded in: no decay, the last rate kept
    assert manager.rates[50].item() == 1.0 and manager.last_success_rate == 1.0


def test_decay_shrinks_old_rates():
    manager = ResetManager(100, 2, window=2, decay=0.5)
    manager.record([50], [True])
    manager.update()
    manager.record([60], [True])
    manager.update()
    assert manager.rates[50].item() == 0.5 and manager.rates[60].item() == 1.0


def test_assign_staggers_below_maximum_and_clamps():
    manager = ResetManager(1000, 8, window=32, maximum=900)
    assert manager.assign().tolist() == [900, 896, 892, 888, 884, 880, 876, 872]
    manager.maximum = 10
    assert manager.assign().tolist() == [10, 6, 2, 0, 0, 0, 0, 0]
    assert ResetManager(1000, 3, window=10).assign().tolist() == [999, 996, 993]


def test_due_and_state_dict_round_trip():
    manager = ResetManager(100, 4, update_every=3)
    manager.record([99, 98], [True, False])
    assert not manager.due
    state = manager.state_dict()
    other = ResetManager(100, 4, update_every=3)
    other.load_state_dict(state)
    other.record([97], [True])
    manager.record([97], [True])
    assert other.due and manager.due
    assert other.update() == manager.update()
    assert torch.equal(other.rates, manager.rates)
    with pytest.raises(ValueError, match="rates"):
        ResetManager(50, 4).load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"demo_length": 0}, "demo_length"),
        ({"num_envs": 0}, "num_envs"),
        ({"window": 0}, "window"),
        ({"decay": 0.0}, "decay"),
        ({"move_threshold": 0.0}, "move_threshold"),
        ({"maximum": 100}, "maximum"),
        ({"window": 40, "move_threshold": 0.2}, "exceeds the success mass"),  # 8 > 3 points below
        ({"window": 4, "move_threshold": 0.8}, "exceeds the success mass"),  # 3.2 > 3: 4 points, 3 below
        ({"num_envs": 1, "window": 32, "move_threshold": 0.5}, "exceeds the success mass"),  # one point: 16 > 1
    ],
)
def test_manager_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResetManager(**{"demo_length": 100, "num_envs": 4, **kwargs})


@pytest.mark.parametrize("kwargs, match", [({"num_envs": True}, "num_envs must be an int"),
                                           ({"maximum": 5.5}, "maximum must be an int"),
                                           ({"decay": "1"}, "decay must be a real number")])
def test_manager_rejects_arguments_of_the_wrong_type(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ResetManager(**{"demo_length": 100, "num_envs": 4, **kwargs})


def test_maximum_outside_the_demo_is_refused_at_once():
    # a 100-step demo has starting points 0..99: 100 and -1 are refused on assignment and on
    # load_state_dict, which then leaves the manager as it was
    manager = ResetManager(100, 4, maximum=50)
    for bad in (100, -1):
        with pytest.raises(ValueError, match=rf"maximum must be in \[0, 99\], got {bad!r}"):
            manager.maximum = bad
    with pytest.raises(TypeError, match=r"maximum must be an int in \[0, 99\], got 7.0"):
        manager.maximum = 7.0
    assert manager.maximum == 50
    state = {**ResetManager(100, 4).state_dict(), "maximum": 100}
    with pytest.raises(ValueError, match=r"maximum must be in \[0, 99\], got 100"):
        manager.load_state_dict(state)
    assert manager.maximum == 50 and manager.assign().tolist() == [50, 49, 48, 47]


def test_manager_and_transform_take_numpy_integers():
    manager = ResetManager(np.int64(100), np.int32(4), window=np.uint8(8), maximum=np.int64(50))
    assert manager.assign().tolist() == [50, 48, 46, 44]  # 50 - (i * 8) // 4
    manager.maximum = np.int16(20)
    assert manager.maximum == 20 and type(manager.maximum) is int
    assert manager.assign().tolist() == [20, 18, 16, 14]
    manager.load_state_dict({**manager.state_dict(), "maximum": np.int64(30)})
    assert manager.maximum == 30 and type(manager.maximum) is int
    manager.record(np.array([29, 30], np.uint64), np.array([True, False]))
    assert manager.num_pending == 2
    transform = ReverseCurriculum(Demo([0] * 100, [0.0] * 99 + [1.0]), restore="replay", seed=np.int64(0), frames_per_step=np.int64(4))
    assert transform.frames_per_step == 4 and type(transform.frames_per_step) is int


def test_record_rejects_bad_input():
    manager = ResetManager(100, 2)
    # success rates or rounded points would be silently cast: 0.5 -> True, 1.7 -> 1
    with pytest.raises(TypeError, match="successes must be bool"):
        manager.record([1, 2], [1.0, 0.5])
    with pytest.raises(TypeError, match="successes must be bool"):
        manager.record(torch.tensor([1, 2]), torch.tensor([2, 0]))
    with pytest.raises(TypeError, match="starting_points must be integers"):
        manager.record(torch.tensor([1.7, 2.2]), [True, False])
    assert manager.num_pending == 0
    with pytest.raises(ValueError, match="same number"):
        manager.record([1, 2], [True])
    with pytest.raises(ValueError, match=r"\[0, 99\]"):
        manager.record([100], [True])



@pytest.mark.parametrize("num_envs, window, threshold", [(2, 2, 0.5), (4, 4, 0.75), (16, 16, 15 / 16)])
def test_every_accepted_threshold_lets_full_success_move_back(num_envs, window, threshold):
    """At the bound (the points below the maximum holding all the mass), every episode
    succeeding moves the maximum back; a threshold past it is refused, not left stuck."""
    manager = ResetManager(100, num_envs, window=window, move_threshold=threshold)
    for _ in range(5):
        manager.record(manager.assign(), torch.ones(num_envs, dtype=torch.bool))
        manager.update()
    assert manager.maximum < 99
    with pytest.raises(ValueError, match="could never move back"):
        ResetManager(100, num_envs, window=window, move_threshold=threshold + 0.01)


def test_a_corrupt_state_is_refused_and_leaves_the_manager_as_it_was():
    manager = ResetManager(100, 4, maximum=60)
    manager.record([58, 59], [True, False])
    before = manager.state_dict()
    good = ResetManager(100, 4, maximum=30).state_dict()
    for change, match in (({"rates": torch.full((100,), float("nan"))}, r"outside \[0, 1\]"),
                          ({"rates": -torch.ones(100)}, r"outside \[0, 1\]"),
                          ({"pending_points": torch.tensor([500]), "pending_successes": torch.tensor([True])},
                           r"must lie in \[0, 99\]")):
        with pytest.raises(ValueError, match=match):
            manager.load_state_dict({**good, **change})
        after = manager.state_dict()
        assert manager.maximum == 60 and all(torch.equal(torch.as_tensor(after[k]), torch.as_tensor(before[k]))
                                             for k in before if k != "last_success_rate")
