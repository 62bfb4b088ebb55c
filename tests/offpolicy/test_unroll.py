"""unroll_with_next and RecurrentDQNLoss against a per-episode, per-step loop of the same network."""
import copy

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.objectives import HardUpdate

from torchrl_seqchunk import RecurrentDQNLoss, ResetRNN, unroll_with_next

OBS, HIDDEN, ACTIONS = 3, 5, 2


def q_network(cell="gru"):
    rnn_class = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
    rnn = ResetRNN(rnn_class(4, HIDDEN, batch_first=True), state_key="q_state",
                   reset_state_key="q_state")
    net = TensorDictSequential(
        TensorDictModule(nn.Linear(OBS, 4), ["observation"], ["embed"]), rnn,
        TensorDictModule(nn.Linear(HIDDEN, ACTIONS), ["features"], ["action_value"]))
    return net.double(), rnn


def step(net, rnn, obs, state):
    """One step of the network by hand: (Q [A], new state), state a tuple of [1, 1, H]."""
    encoder, _, head = net
    x = encoder.module(obs).view(1, 1, -1)
    y, new = rnn.rnn(x, state if len(state) > 1 else state[0])
    return head.module(y.view(-1)), (new if isinstance(new, tuple) else (new,))


def dqn_loss(net, rnn, **kwargs):
    """RecurrentDQNLoss with its target network's updater, as a user builds it."""
    loss = RecurrentDQNLoss(net, rnn, **kwargs)
    if loss.delay_value:
        HardUpdate(loss, value_network_update_interval=1000)
    return loss


def zeros(n_entries):
    return tuple(torch.zeros(1, 1, HIDDEN, dtype=torch.float64) for _ in range(n_entries))


def make_chunk(steps=9, rows=3, seed=0):
    """Rows with a termination, a truncation, an is_first at t=0 and a continuing start."""
    g = torch.Generator().manual_seed(seed)
    flag = lambda: torch.zeros(rows, steps, 1, dtype=torch.bool)  # noqa: E731
    done, terminated, is_first = flag(), flag(), flag()
    terminated[0, 2] = done[0, 2] = True       # row 0: termination at 2
    done[1, 4] = True                           # row 1: truncation at 4
    done[2, 1] = True; done[2, 5] = True; terminated[2, 5] = True  # row 2: both
    is_first[:, 1:] = done[:, :-1]
    is_first[0, 0] = True                       # row 0 starts an episode; rows 1, 2 continue
    obs = torch.randn(rows, steps, OBS, generator=g, dtype=torch.float64)
    next_obs = torch.randn(rows, steps, OBS, generator=g, dtype=torch.float64)  # final, chunk end
    inside = ~is_first[:, 1:, 0]  # the next step continues the episode: its observation
    next_obs[:, :-1][inside] = obs[:, 1:][inside]
    return TensorDict({
        "observation": obs, ("next", "observation"): next_obs,
        "is_first": is_first, ("next", "done"): done, ("next", "terminated"): terminated,
        ("next", "truncated"): done & ~terminated,
        ("next", "reward"): torch.randn(rows, steps, 1, generator=g, dtype=torch.float64),
        "action": nn.functional.one_hot(torch.randint(ACTIONS, (rows, steps), generator=g), ACTIONS),
    }, batch_size=[rows, steps])


def reference(net, rnn, td, initial):
    """Per step: Q(o_t) and Q(next o_t) (the true next observation, also at the chunk end)
    under the memory after step t; every episode starts from zeros."""
    rows, steps = td.shape
    values = torch.zeros(rows, steps, ACTIONS, dtype=torch.float64)
    next_values = torch.zeros_like(values)
    finals = []
    for b in range(rows):
        state = initial(b)
        for t in range(steps):
            if td["is_first"][b, t]:
                state = zeros(len(state))
            values[b, t], state = step(net, rnn, td["observation"][b, t], state)
            next_values[b, t], _ = step(net, rnn, td["next", "observation"][b, t], state)
        finals.append(state)
    return values, next_values, finals


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("with_initial", [False, True])
def test_values_and_next_values_match_a_per_step_loop(cell, with_initial):
    net, rnn = q_network(cell)
    td = make_chunk()
    entries = len(rnn.state_keys)
    g = torch.Generator().manual_seed(1)
    h0 = tuple(torch.randn(3, 1, HIDDEN, generator=g, dtype=torch.float64) for _ in range(entries))
    out = unroll_with_next(net, rnn, td, h0 if with_initial else None)
    initial = (lambda b: tuple(h[b:b + 1] for h in h0)) if with_initial else (lambda b: zeros(entries))
    values, next_values, finals = reference(net, rnn, td, initial)
    torch.testing.assert_close(out.values, values)
    live = ~td["next", "terminated"].squeeze(-1)  # after a termination no value is needed
    torch.testing.assert_close(out.next_values[live], next_values[live])
    for i in range(entries):
        torch.testing.assert_close(out.final_state[i], torch.cat([f[i] for f in finals]))
    # row 1 has one truncation inside the chunk: one inserted step; + 1 chunk-end step
    assert out.recurrent_steps == 3 * (9 + 1 + 1)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_without_a_terminated_key_a_truncation_bootstraps_from_its_final_observation(cell):
    # terminated is then done less truncated, as boundary_nstep_targets reads it: the truncated
    # step of row 1 still gets the value of its final observation, not of the next episode's first
    net, rnn = q_network(cell)
    td = make_chunk()
    _, next_values, _ = reference(net, rnn, td, lambda b: zeros(len(rnn.state_keys)))
    live = ~td["next", "terminated"].squeeze(-1)
    bare = td.exclude(("next", "terminated"))
    out = unroll_with_next(net, rnn, bare)
    torch.testing.assert_close(out.next_values[live], next_values[live])
    assert out.recurrent_steps == 3 * (9 + 1 + 1)  # the truncation's final observation inserted
    assert not torch.allclose(next_values[1, 4], out.values[1, 5])  # which the next episode's value is not
    losses = [dqn_loss(net, rnn, gamma=0.5, n_steps=2, initial_state="zero")(chunk)["loss"] for chunk in (td, bare)]
    torch.testing.assert_close(losses[1], losses[0])


def test_a_chunk_split_in_two_with_the_carry_equals_one_unroll():
    net, rnn = q_network()
    td = make_chunk(steps=10)
    whole = unroll_with_next(net, rnn, td)
    first = unroll_with_next(net, rnn, td[:, :6])
    second = unroll_with_next(net, rnn, td[:, 6:], first.final_state)
    torch.testing.assert_close(torch.cat([first.values, second.values], 1), whole.values)
    torch.testing.assert_close(second.next_values, whole.next_values[:, 6:])


@pytest.mark.parametrize("bootstrap", [True, False])
def test_the_rnn_is_left_carrying_the_final_state_and_must_be_inside_the_network(bootstrap):
    # the step at the chunk's end (next observation) must not move the carry past the chunk
    net, rnn = q_network()
    out = unroll_with_next(net, rnn, make_chunk(), bootstrap=bootstrap)
    torch.testing.assert_close(rnn.carried_state["q_state"], out.final_state[0])
    _, finals = reference(net, rnn, make_chunk(), lambda b: zeros(1))[1:]
    torch.testing.assert_close(out.final_state[0], torch.cat([f[0].view(1, 1, -1) for f in finals]))
    target = copy.deepcopy(net)  # its own rnn: the online one would give the online carry
    with pytest.raises(ValueError, match="network does not contain rnn"):
        unroll_with_next(target, rnn, make_chunk())


def test_flags_not_one_per_step_empty_observation_keys_and_a_carried_tensordict_are_named():
    net, rnn = q_network()
    td = make_chunk()
    td["next", "done"] = torch.zeros(3, 9, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"done_key \('next', 'done'\) has shape \[3, 9, 2\]; it must be"):
        unroll_with_next(net, rnn, td)
    with pytest.raises(ValueError, match="observation_keys is empty"):
        unroll_with_next(net, rnn, make_chunk(), observation_keys=[])
    unroll_with_next(net, rnn, make_chunk())
    for carried in (rnn.carried_state, rnn.carried_state["q_state"]):
        with pytest.raises(TypeError, match="initial_state must be None or a tuple of"):
            unroll_with_next(net, rnn, make_chunk(), carried)


def test_is_first_at_the_first_step_ignores_the_initial_state():
    net, rnn = q_network()
    td = make_chunk()
    td["is_first"][:, 0] = True
    h0 = (torch.randn(3, 1, HIDDEN, dtype=torch.float64),)
    torch.testing.assert_close(unroll_with_next(net, rnn, td, h0).values,
                               unroll_with_next(net, rnn, td).values)


def test_rnn_without_reset_state_key_is_refused():
    rnn = ResetRNN(nn.GRU(OBS, HIDDEN, batch_first=True), in_key="observation")
    with pytest.raises(ValueError, match="reset_state_key"):
        unroll_with_next(rnn, rnn, make_chunk())
    with pytest.raises(ValueError, match="reset_state_key"):
        RecurrentDQNLoss(rnn, rnn)


@pytest.mark.parametrize("rows, steps", [(0, 9), (3, 0)])
def test_an_empty_chunk_is_refused(rows, steps):
    net, rnn = q_network()
    with pytest.raises(ValueError, match=r"B, T >= 1"):
        unroll_with_next(net, rnn, make_chunk()[:rows, :steps])


def test_loss_carries_each_networks_own_state_and_computes_the_reference_loss():
    net, rnn = q_network()
    loss = dqn_loss(net, rnn, gamma=0.5, n_steps=2, loss_function="l2")
    with torch.no_grad():  # make the online network differ from its target copy
        for p in loss.value_network_params.values(True, True):
            p.add_(0.3 * torch.randn_like(p))
    td = make_chunk()
    first, second = td[:, :5], td[:, 5:]
    loss(first)
    with loss.value_network_params.to_module(net):
        online = reference(net, rnn, first, lambda b: zeros(1))[2]
    with loss.target_value_network_params.to_module(net):
        target = reference(net, rnn, first, lambda b: zeros(1))[2]
    ended = first["next", "done"][:, -1].view(-1, 1, 1)  # row 1's truncation at 4 ends the chunk: zeros
    assert ended.any()
    torch.testing.assert_close(loss._carries["online"][0], torch.cat([f[0] for f in online]).masked_fill(ended, 0))
    torch.testing.assert_close(loss._carries["target"][0], torch.cat([f[0] for f in target]).masked_fill(ended, 0))

    # the second chunk's loss, by hand: double DQN, 2-step targets, l2
    out = loss(second)
    with loss.value_network_params.to_module(net):
        q, q_next, _ = reference(net, rnn, second, lambda b: online[b])
    with loss.target_value_network_params.to_module(net):
        _, qt_next, _ = reference(net, rnn, second, lambda b: target[b])
    v_next = qt_next.gather(-1, q_next.argmax(-1, keepdim=True)).squeeze(-1)
    r = second["next", "reward"].squeeze(-1)
    done, term = second["next", "done"].squeeze(-1), second["next", "terminated"].squeeze(-1)
    starts = second["is_first"].squeeze(-1)
    rows, steps = second.shape
    want = torch.zeros(rows, steps, dtype=torch.float64)
    for b in range(rows):
        for t in range(steps):
            total, j = r[b, t], t
            if not done[b, t] and t + 1 < steps and not starts[b, t + 1]:
                j = t + 1
                total = total + 0.5 * r[b, j]
            if not term[b, j]:
                total = total + 0.5 ** (j - t + 1) * v_next[b, j]
            want[b, t] = total
    chosen = (q * second["action"]).sum(-1)
    torch.testing.assert_close(out["loss"], ((chosen - want) ** 2).mean())


def test_a_learned_initial_state_is_refused():
    rnn = ResetRNN(nn.GRU(4, HIDDEN, batch_first=True), state_key="q_state", reset_state_key="q_state",
                   initial_state="learned")
    net = TensorDictSequential(
        TensorDictModule(nn.Linear(OBS, 4), ["observation"], ["embed"]), rnn,
        TensorDictModule(nn.Linear(HIDDEN, ACTIONS), ["features"], ["action_value"]))
    with pytest.raises(ValueError, match="initial_state='learned'.*never be trained"):
        RecurrentDQNLoss(net, rnn)


def test_loss_refuses_a_carry_of_other_rows_and_reset_carry_clears_it():
    net, rnn = q_network()
    loss = dqn_loss(net, rnn)
    loss(make_chunk(rows=3))
    with pytest.raises(ValueError, match="reset_carry"):
        loss(make_chunk()[:2])
    loss.reset_carry()
    loss(make_chunk()[:2])
    state = loss.state_dict()
    fresh = dqn_loss(*q_network())
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh._carries["target"][0], loss._carries["target"][0])


@pytest.mark.parametrize("action_space, action, says", [
    ("one_hot", lambda idx: idx.unsqueeze(-1), "action_space='categorical'"),  # [B, T, 1]: k * sum(Q) before
    ("one_hot", lambda idx: idx, "action_space='categorical'"),
    ("categorical", lambda idx: nn.functional.one_hot(idx, ACTIONS), "action_space='one_hot'"),
])
def test_actions_of_the_other_action_space_are_refused_by_name(action_space, action, says):
    chunk = make_chunk()
    chunk["action"] = action(chunk["action"].argmax(-1))
    loss = dqn_loss(*q_network(), action_space=action_space)
    with pytest.raises(ValueError, match=f"got 'action' of shape .*pass {says}"):
        loss(chunk)


@pytest.mark.parametrize("action_space, action, error, says", [
    ("one_hot", lambda idx: 3 * nn.functional.one_hot(idx, ACTIONS), ValueError, "a single 1 per step"),
    ("one_hot", lambda idx: torch.ones(*idx.shape, ACTIONS), ValueError, "a single 1 per step"),
    ("categorical", lambda idx: idx + ACTIONS, ValueError, r"must be in \[0, 2\)"),
    ("categorical", lambda idx: idx - 1, ValueError, r"must be in \[0, 2\)"),
    ("categorical", lambda idx: 0.9 * idx, TypeError, "integer action indices"),
    ("one_hot", None, ValueError, "action_key='action' is not in the batch"),
])
def test_actions_that_are_not_one_hot_or_in_range_are_refused(action_space, action, error, says):
    chunk = make_chunk()
    if action is None:
        del chunk["action"]
    else:
        chunk["action"] = action(chunk["action"].argmax(-1))
    with pytest.raises(error, match=says):
        dqn_loss(*q_network(), action_space=action_space)(chunk)


def test_categorical_actions_give_the_one_hot_loss():
    net, rnn = q_network()
    chunk = make_chunk()
    one_hot = dqn_loss(net, rnn, delay_value=False, double_dqn=False)(chunk)["loss"]
    for shape in ((3, 9), (3, 9, 1)):
        indices = chunk.clone()
        indices["action"] = chunk["action"].argmax(-1).reshape(shape)
        categorical = dqn_loss(net, rnn, delay_value=False, double_dqn=False, action_space="categorical")
        torch.testing.assert_close(categorical(indices)["loss"], one_hot)


@pytest.mark.parametrize("key", [("next", "done"), ("next", "terminated"), ("next", "truncated")])
def test_flags_of_another_dtype_are_refused_by_name(key):
    net, rnn = q_network()
    chunk = make_chunk()
    chunk[key] = chunk[key].float()
    with pytest.raises(TypeError, match=f"{key[1]}_key=.*has dtype torch.float32; flags must be torch.bool"):
        unroll_with_next(net, rnn, chunk, None)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_row_whose_batch_ends_an_episode_carries_zeros_into_the_next(overlap):
    net, rnn = q_network()
    options = dict(burn_in=2, overlap=True) if overlap else {}
    first, second = make_chunk(seed=1), make_chunk(seed=2)
    second["is_first"][:, 0] = False  # the next batch does not flag its first steps
    carry_point = -1 - (2 if overlap else 0)
    first["next", "done"][:, carry_point] = torch.tensor([[True], [False], [True]])  # rows 0 and 2 end there
    loss = dqn_loss(net, rnn, **options)
    loss(first)
    carried = [h.clone() for h in loss._carries["online"]]
    assert all(h[[0, 2]].abs().sum() == 0 and h[1].abs().sum() > 0 for h in carried)
    # the same as flagging the episode starts the next batch leaves out
    flagged = dqn_loss(net, rnn, **options)
    flagged(first)
    marked = second.clone()
    marked["is_first"][[0, 2], 0] = True
    torch.testing.assert_close(loss(second)["loss"], flagged(marked)["loss"])


@pytest.mark.parametrize("layout", [(3, 9), (3, 9, 1)])
def test_stream_ids_keep_one_carry_per_stream_whatever_rows_a_batch_holds(layout):
    """Three streams trained two chunks long, each chunk in row groups of any order, give
    each stream the carry (and each group the loss) of the rows trained all together."""
    net, rnn = q_network()
    whole = dqn_loss(net, rnn, gamma=0.5, n_steps=2)
    by_stream = dqn_loss(net, rnn, gamma=0.5, n_steps=2, stream_key="stream")
    by_stream.load_state_dict(whole.state_dict())  # the same target network
    td = make_chunk()
    td["stream"] = torch.arange(3, dtype=torch.int32).view(3, 1, 1).expand(3, 9, 1).reshape(layout)
    first, second = td[:, :5], td[:, 5:]
    whole(first)
    after_first = {name: carry[0].clone() for name, carry in whole._carries.items()}
    whole(second)
    by_stream(first[torch.tensor([2, 0])])  # stream 1 not yet seen: it starts from zeros
    by_stream(first[torch.tensor([1])])
    rows = torch.tensor([1, 2])
    out = by_stream(second[rows])
    reference_loss = dqn_loss(net, rnn, gamma=0.5, n_steps=2)
    reference_loss.load_state_dict(whole.state_dict())
    reference_loss._carries = {name: (carry[rows],) for name, carry in after_first.items()}
    torch.testing.assert_close(out["loss"], reference_loss(second[rows])["loss"])
    by_stream(second[torch.tensor([0])])
    for name in ("online", "target"):
        torch.testing.assert_close(by_stream._carries[name][0], whole._carries[name][0])
    by_stream.reset_carry(torch.tensor([False, True]))  # a mask over streams 0 and 1: stream 2 keeps its carry
    carry = by_stream._carries["online"][0]
    assert not carry[1].any() and carry[0].any() and carry[2].any()
    by_stream.reset_carry(torch.tensor([True, False, False, True]))  # stream 3 was never seen
    assert by_stream._carries["online"][0].shape[0] == 3 and not by_stream._carries["online"][0][0].any()
    with pytest.raises(ValueError, match="one per batch row"):
        whole.reset_carry(torch.tensor([True, False]))


@pytest.mark.parametrize("ids, error, match", [
    (None, ValueError, "not in the batch"),
    (torch.tensor([[0] * 9, [0] * 9, [1] * 9]), ValueError, "differ between rows"),
    (torch.tensor([[0] * 8 + [1], [1] * 9, [2] * 9]), ValueError, "the same along each row"),
    (torch.tensor([[-1] * 9, [1] * 9, [2] * 9]), ValueError, r"\[0, 2\*\*20\)"),
    (torch.tensor([[2 ** 20] * 9, [1] * 9, [2] * 9]), ValueError, r"number the streams 0..P-1"),
    (torch.zeros(3, 9), TypeError, "integers"),
])
def test_bad_stream_ids_are_refused(ids, error, match):
    loss = dqn_loss(*q_network(), stream_key="stream")
    td = make_chunk()
    if ids is not None:
        td["stream"] = ids
    with pytest.raises(error, match=match):
        loss(td)
    with pytest.raises(ValueError, match="initial_state='carry' only"):
        dqn_loss(*q_network(), stream_key="stream", initial_state="stored")
    for bad in (5, ("meta", 5), ()):
        with pytest.raises(TypeError, match="stream_key must be a key"):
            dqn_loss(*q_network(), stream_key=bad)


def test_stored_and_zero_initial_states():
    net, rnn = q_network()
    td = make_chunk()
    td["q_state"] = torch.randn(3, 9, 1, HIDDEN, dtype=torch.float64)
    stored = RecurrentDQNLoss(net, rnn, initial_state="stored", delay_value=False, double_dqn=False)
    zero = RecurrentDQNLoss(net, rnn, initial_state="zero", delay_value=False, double_dqn=False)
    h0 = (td["q_state"][:, 0],)
    want = unroll_with_next(net, rnn, td, h0).values
    start = stored.carries.start("online", td, rnn, None)
    assert torch.equal(start[0], h0[0]) and zero.carries.start("online", td, rnn, None) is None
    with stored.value_network_params.to_module(net):
        torch.testing.assert_close(unroll_with_next(net, rnn, td, start).values, want)


def test_a_pass_without_bootstrap_gives_the_values_and_final_state_only():
    net, rnn = q_network("lstm")
    td = make_chunk()
    g = torch.Generator().manual_seed(2)
    h0 = tuple(torch.randn(3, 1, HIDDEN, generator=g, dtype=torch.float64) for _ in range(2))
    out = unroll_with_next(net, rnn, td, h0, bootstrap=False)
    values, _, finals = reference(net, rnn, td, lambda b: tuple(h[b:b + 1] for h in h0))
    torch.testing.assert_close(out.values, values)
    for i in range(2):
        torch.testing.assert_close(out.final_state[i], torch.cat([f[i] for f in finals]))
    assert out.next_values is None and out.recurrent_steps == 3 * 9  # no final observation, no chunk end


@pytest.mark.parametrize("clear_start", [False, True], ids=["flagged", "done_only"])
def test_burn_in_equals_the_loss_on_the_rest_from_the_state_a_per_step_loop_reaches(clear_start):
    """burn_in=K: the first K steps only rebuild the memory, without gradient (R2D2); the
    loss and its gradients equal those of the rest, started from the state a per-step loop
    reaches after step K - 1 (zeros where the episode ends there)."""
    burn_in = 3
    net, rnn = q_network()
    td = make_chunk()  # row 0 terminates at step 2: its rest starts an episode
    g = torch.Generator().manual_seed(3)
    td["q_state"] = torch.randn(3, 9, 1, HIDDEN, generator=g, dtype=torch.float64)  # stored memories
    if clear_start:  # an episode end at the burn-in's last step, without is_first after it
        td["is_first"][0, burn_in] = False
    with torch.no_grad():
        _, _, finals = reference(net, rnn, td[:, :burn_in], lambda b: (td["q_state"][b:b + 1, 0],))
    rest = td[:, burn_in:].clone()
    rest["q_state"][:, 0] = torch.cat([f[0] for f in finals])
    rest["is_first"][0, 0] = True
    results = []
    for loss, batch in ((dqn_loss(net, rnn, initial_state="stored", n_steps=2, burn_in=burn_in), td),
                        (dqn_loss(net, rnn, initial_state="stored", n_steps=2), rest)):
        out = loss(batch)
        results.append((out, torch.autograd.grad(out["loss"], list(net.parameters()))))
    (out, grads), (want, want_grads) = results
    torch.testing.assert_close(out["loss"], want["loss"])
    for grad, want_grad in zip(grads, want_grads):
        torch.testing.assert_close(grad, want_grad)
    # both networks: the burn-in's 3 x 3 steps without bootstrap, plus the rest's unroll
    assert int(out["recurrent_steps"]) == int(want["recurrent_steps"]) + 2 * 3 * burn_in
    assert td["is_first"][0, burn_in] == (not clear_start)  # the caller's batch is left as it was


def test_burn_in_leaving_no_step_is_refused():
    net, rnn = q_network()
    with pytest.raises(ValueError, match="burn_in"):
        dqn_loss(net, rnn, initial_state="stored", burn_in=-1)
    loss = dqn_loss(net, rnn, initial_state="zero", burn_in=9)
    with pytest.raises(ValueError, match="burn_in=9 leaves none"):
        loss(make_chunk(steps=9))


def test_burn_in_refuses_float_flags_and_stored_needs_the_state_key():
    net, rnn = q_network()
    td = make_chunk()
    td["is_first"] = td["is_first"].double()
    with pytest.raises(TypeError, match="torch.bool"):
        dqn_loss(net, rnn, initial_state="zero", burn_in=3)(td)
    with pytest.raises(ValueError, match="q_state"):  # make_chunk stores no memory
        dqn_loss(net, rnn, initial_state="stored")(make_chunk())


def make_stream(steps=20, rows=3, seed=4):
    """Rows of one stream each, for test_overlap_gives_the_loss_and_gradients_of_the_carry_taken_at_the_end
    (K=2, T=6: warm-ups at 6-7 and 12-13, learned steps from 8 and 14): row 0 ends episodes
    inside and at a warm-up's last step, row 1 runs one episode across every junction (its
    loss needs the carry), row 2 starts episodes without a done before them (a stream that
    dropped an episode's rest) at a learned part's first step and inside a warm-up."""
    td = make_chunk(steps=steps, rows=rows, seed=seed)
    ends = {0: [(2, True), (7, True), (13, False)], 1: [(4, False)], 2: [(5, True)]}
    for key in ("done", "terminated", "truncated"):
        td["next", key].zero_()
    for row, row_ends in ends.items():
        for t, terminated in row_ends:
            td["next", "done"][row, t] = True
            td["next", "terminated" if terminated else "truncated"][row, t] = True
    td["is_first"].zero_()
    td["is_first"][:, 1:] = td["next", "done"][:, :-1]
    td["is_first"][:, 0] = True
    td["is_first"][2, 8] = td["is_first"][2, 13] = True  # dropped rests: no done before them
    return td


def test_overlap_gives_the_loss_and_gradients_of_the_carry_taken_at_the_end():
    """With the network fixed, batches of a stream overlapping by K (burn-in = the previous
    batch's last K steps, the carry taken before them) give each chunk the loss and gradients
    of plain stream chunks, whose carry is taken at the end: the burn-in rebuilds the same
    memory. A carry taken at the end of an overlapping batch would run K steps twice."""
    k, t = 2, 6
    net, rnn = q_network()
    plain = dqn_loss(net, rnn, gamma=0.5, n_steps=2)
    overlapping = dqn_loss(net, rnn, gamma=0.5, n_steps=2, burn_in=k, overlap=True)
    for loss in (plain, overlapping):  # online and target differ, the same way in both
        torch.manual_seed(0)
        with torch.no_grad():
            for p in loss.value_network_params.values(True, True):
                p.add_(0.3 * torch.randn_like(p))
    stream = make_stream()
    plain(stream[:, :k])  # the plain carry at step k, where the first overlapping batch's loss starts
    for start in (k, k + t, k + 2 * t):
        want, out = plain(stream[:, start:start + t]), overlapping(stream[:, start - k:start + t])
        torch.testing.assert_close(out["loss"], want["loss"])
        torch.testing.assert_close(torch.autograd.grad(out["loss"], list(overlapping.value_network_params.values(True, True))),
                                   torch.autograd.grad(want["loss"], list(plain.value_network_params.values(True, True))))
        # both networks: burn-in k and the pass before the overlap (t - k steps), no bootstrap
        assert int(out["recurrent_steps"]) == int(want["recurrent_steps"]) + 2 * 3 * t
    carried = overlapping._carries["online"][0]
    with overlapping.value_network_params.to_module(net):  # the state before the last k steps
        _, _, finals = reference(net, rnn, stream[:, :-k], lambda b: zeros(1))
    torch.testing.assert_close(carried, torch.cat([f[0] for f in finals]))


def test_overlap_is_refused_without_a_carry_or_burn_in_and_on_short_batches():
    net, rnn = q_network()
    with pytest.raises(ValueError, match="overlap=True needs initial_state='carry' and burn_in >= 1"):
        dqn_loss(net, rnn, overlap=True)
    with pytest.raises(ValueError, match="overlap=True needs"):
        dqn_loss(net, rnn, initial_state="zero", burn_in=2, overlap=True)
    with pytest.raises(TypeError, match="overlap must be a bool"):
        dqn_loss(net, rnn, burn_in=2, overlap=1)
    loss = dqn_loss(net, rnn, burn_in=3, overlap=True)
    with pytest.raises(ValueError, match="burn_in=3 leaves no step before the overlap"):
        loss(make_chunk(steps=6))
    with pytest.raises(ValueError, match="burn_in=3 leaves none for the loss"):
        loss(make_chunk()[:, :3])
    loss(make_chunk(steps=7))


def test_mask_key_drops_the_same_steps_from_the_loss_and_the_td_error():
    """Over the kept steps only, by hand: 1-step targets r + gamma (1 - terminated) max_a Q(s', a)
    of the per-step loop; the dropped steps carry rewards far off every value."""
    net, rnn = q_network()
    loss = dqn_loss(net, rnn, gamma=0.5, initial_state="zero", delay_value=False, double_dqn=False,
                    loss_function="l2", mask_key="learn")
    td = make_chunk()
    kept = torch.zeros(3, 9, dtype=torch.bool)
    kept[:, 3:] = True
    kept[1, 6] = False
    td["learn"] = kept
    td["next", "reward"][~kept] = 100.0
    out = loss(td)
    with loss.value_network_params.to_module(net), torch.no_grad():
        q, q_next, _ = reference(net, rnn, td, lambda b: zeros(1))
    term = td["next", "terminated"].squeeze(-1)
    want = td["next", "reward"].squeeze(-1) + 0.5 * (~term) * q_next.max(-1).values
    gap = ((q * td["action"]).sum(-1) - want)[kept]
    torch.testing.assert_close(out["loss"], (gap ** 2).mean())
    torch.testing.assert_close(out["td_error"], gap.abs().mean())


def test_a_list_of_value_keys_gives_tensordicts_of_each_keys_values():
    net, rnn = q_network("lstm")
    td = make_chunk()
    _, next_values, _ = reference(net, rnn, td, lambda b: zeros(2))
    both = unroll_with_next(net, rnn, td, value_key=["action_value", "features"])
    one = unroll_with_next(net, rnn, td)
    assert both.values.batch_size == both.next_values.batch_size == td.batch_size
    torch.testing.assert_close(both.values["action_value"], one.values)
    torch.testing.assert_close(both.next_values["action_value"], one.next_values)
    live = ~td["next", "terminated"].squeeze(-1)
    torch.testing.assert_close(both.next_values["action_value"][live], next_values[live])
    assert both.values["features"].shape == (3, 9, HIDDEN)
    bare = unroll_with_next(net, rnn, td, value_key=["action_value"], bootstrap=False)
    assert bare.next_values is None and torch.equal(bare.values["action_value"], one.values)
    with pytest.raises(ValueError, match="value_key is an empty list"):
        unroll_with_next(net, rnn, td, value_key=[])
