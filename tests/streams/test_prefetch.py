import gc
import queue
import threading
import time
import traceback

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from waiting import wait_for  # tests/waiting.py

from torchrl_seqchunk import ChunkPrefetcher, StreamChunkSampler


def counter(delay=0.0):
    """A source returning chunks 0, 1, 2, ... with an optional production delay."""
    count = iter(range(10**6))

    def source():
        time.sleep(delay)
        return TensorDict({"k": torch.tensor(next(count))}, [])

    return source


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "ChunkPrefetcher"]


def waits_to_put(q):
    """A thread is blocked in ``q.put`` (only the worker puts while the test runs)."""
    with q.mutex:
        return bool(q.not_full._waiters)


def waits_to_get(q):
    """A thread is blocked in ``q.get`` (the consumer, in ``next()``)."""
    with q.mutex:
        return bool(q.not_empty._waiters)


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_order_holds_with_a_slow_consumer(depth):
    with ChunkPrefetcher(counter(), depth=depth) as chunks:
        got = []
        for chunk in chunks:
            got.append(chunk["k"].item())
            time.sleep(0.002 if len(got) % 3 == 0 else 0.0)  # the queue fills up meanwhile
            if len(got) == 40:
                break
    assert got == list(range(40))


def test_prefetched_chunks_equal_direct_sampling():
    def make():
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=StreamChunkSampler(4, 5, generator=torch.Generator().manual_seed(1)),
            batch_size=20,
        )
        done = torch.zeros(150, 1, dtype=torch.bool)
        done[[6, 20, 27, 60, 61, 99, 120, 149]] = True
        rb.extend(TensorDict({"obs": torch.arange(150), ("next", "done"): done}, [150]))
        return rb

    direct = make()
    expected = [direct.sample() for _ in range(12)]
    with ChunkPrefetcher(make().sample, depth=8, device="cpu") as chunks:
        got = [next(chunks) for _ in range(12)]
    for want, have in zip(expected, got):
        assert (want == have).all()


def test_replay_buffer_as_iterable_source_gives_one_epoch():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=StreamChunkSampler(2, 4, replacement=False),
        batch_size=8,
    )
    done = torch.zeros(20, 1, dtype=torch.bool)
    done[[4, 9, 19]] = True  # episodes of 5, 5 and 10 steps: streams of 10 steps each
    rb.extend(TensorDict({"obs": torch.arange(20), ("next", "done"): done}, [20]))
    with ChunkPrefetcher(rb, depth=2) as chunks:
        epoch = list(chunks)
    assert len(epoch) == 3  # ceil(10 / 4) chunks
    data = torch.cat(epoch, 1)
    assert sorted(data["obs"][data["collector", "mask"]].tolist()) == list(range(20))


def test_iterable_source_ends_and_thread_exits():
    source = [TensorDict({"k": torch.tensor(i)}, []) for i in range(5)]
    prefetcher = ChunkPrefetcher(source, depth=2)
    assert [chunk["k"].item() for chunk in prefetcher] == [0, 1, 2, 3, 4]
    with pytest.raises(StopIteration):
        next(prefetcher)
    assert not prefetch_threads()


def test_worker_exception_surfaces_with_its_traceback():
    count = iter(range(100))

    def failing_source():
        k = next(count)
        if k == 3:
            raise ValueError("storage went away")
        return TensorDict({"k": torch.tensor(k)}, [])

    prefetcher = ChunkPrefetcher(failing_source, depth=2)
    assert [next(prefetcher)["k"].item() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="storage went away") as info:
        next(prefetcher)
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_source" in frames
    assert not prefetch_threads()


def test_close_joins_the_thread_while_the_queue_is_full():
    prefetcher = ChunkPrefetcher(counter(), depth=2)
    next(prefetcher)
    wait_until_full(prefetcher)  # the worker now blocks on a full queue
    assert len(prefetch_threads()) == 1
    prefetcher.close()
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_close_ends_the_iteration_when_the_workers_last_chunk_lands_during_close(monkeypatch):
    """With ``depth=1``, the worker waits to queue its next chunk. ``close(timeout=0)`` makes
    room in the queue, and the worker's put may then land at any point in ``close``. The
    queue below lets it land at the worst moment for a close that empties the queue and then
    adds its end marker: right after the queue was found empty. That close used to fail
    with ``queue.Full``."""

    class PutLandsWhenFoundEmpty(queue.Queue):
        def get_nowait(self):
            try:
                return super().get_nowait()
            except queue.Empty:
                wait_for(lambda: self.qsize() > 0, "the worker's put landing")
                raise

    monkeypatch.setattr(queue, "Queue", PutLandsWhenFoundEmpty)
    prefetcher = ChunkPrefetcher(counter(), depth=1)
    wait_until_full(prefetcher)
    with pytest.warns(UserWarning):  # no time given to join: the worker is still running
        prefetcher.close(timeout=0)
    with pytest.raises(StopIteration):
        next(prefetcher)
    assert wait_for_no_prefetch_thread()


def test_bad_arguments():
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        ChunkPrefetcher(counter(), depth=0)
    with pytest.raises(TypeError, match="depth must be an int"):
        ChunkPrefetcher(counter(), depth=2.0)
    with pytest.raises(TypeError, match="source must be a callable"):
        ChunkPrefetcher(42)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="pinning works here")
def test_pin_memory_without_an_accelerator_is_refused_up_front():
    with pytest.raises(ValueError, match=r"\(given True, device None\) needs an accelerator"):
        ChunkPrefetcher(counter(), pin_memory=True)
    assert not prefetch_threads()


def wait_for_no_prefetch_thread(seconds=30.0):
    deadline = time.monotonic() + seconds
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not prefetch_threads()


def test_dropped_prefetcher_stops_its_thread():
    prefetcher = ChunkPrefetcher(counter(), depth=2)
    next(prefetcher)
    del prefetcher
    gc.collect()
    assert wait_for_no_prefetch_thread()


def test_close_from_another_thread_ends_a_waiting_consumer():
    release = threading.Event()

    def blocked_source():
        release.wait()
        return TensorDict({"k": torch.tensor(0)}, [])

    prefetcher = ChunkPrefetcher(blocked_source, depth=1)
    got = []
    consumer = threading.Thread(target=lambda: got.append(next(prefetcher, "ended")), daemon=True)
    consumer.start()
    wait_for(lambda: waits_to_get(prefetcher._queue), "the consumer waits in next()")
    closer = threading.Thread(target=prefetcher.close, kwargs={"timeout": 30}, daemon=True)
    closer.start()
    wait_for(prefetcher._stop.is_set, "close() sets the stop")
    release.set()  # the worker returns, sees the stop and ends
    closer.join(30)
    consumer.join(30)
    assert not closer.is_alive()
    assert not consumer.is_alive() and got == ["ended"]
    assert not prefetch_threads()


def test_a_generator_function_is_refused():
    def chunks():
        yield TensorDict({"k": torch.tensor(0)}, [])

    with pytest.raises(TypeError, match=r"generator function.*source=chunks\(\)"):
        ChunkPrefetcher(chunks)
    assert [c["k"].item() for c in ChunkPrefetcher(chunks())] == [0]



def stream_buffer(replacement=True):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(200),
        sampler=StreamChunkSampler(
            3, 4, replacement=replacement, generator=torch.Generator().manual_seed(2)
        ),
        batch_size=12,
    )
    done = torch.zeros(60, 1, dtype=torch.bool)
    done[[6, 13, 14, 30, 41, 59]] = True
    rb.extend(TensorDict({"obs": torch.arange(60), ("next", "done"): done}, [60]))
    return rb


def wait_until_full(prefetcher):
    """The queue is full and the worker has drawn one more chunk and waits to queue it."""
    queue = prefetcher._queue
    wait_for(lambda: queue.full() and waits_to_put(queue), "the worker blocks on a full queue")


@pytest.mark.parametrize("replacement", [True, False])
def test_chunks_drawn_but_not_delivered_come_next_after_close(replacement):
    # the reference: one uninterrupted run of plain samples (epochs of 5 chunks without
    # replacement, so a new epoch is dealt among the chunks the prefetcher drew ahead)
    direct = stream_buffer(replacement)
    expected = [direct.sample()["obs"] for _ in range(12)]
    rb = stream_buffer(replacement)
    got = []
    for _ in range(2):  # two loops, as a training script run twice over one buffer
        with ChunkPrefetcher(rb.sample, depth=3) as chunks:
            got += [next(chunks)["obs"] for _ in range(4)]
            wait_until_full(chunks)  # 4 more chunks drawn, never delivered
    got += [rb.sample()["obs"] for _ in range(4)]
    for want, have in zip(expected, got, strict=True):
        assert (want == have).all()


def test_state_saved_while_a_prefetcher_runs_resumes_after_the_last_delivered_chunk():
    direct = stream_buffer()
    expected = [direct.sample()["obs"] for _ in range(6)]
    rb = stream_buffer()
    with ChunkPrefetcher(rb.sample, depth=2) as chunks:
        assert (next(chunks)["obs"] == expected[0]).all()
        assert (next(chunks)["obs"] == expected[1]).all()
        wait_until_full(chunks)  # the sampler itself stands 3 chunks ahead
        state = {**rb.state_dict(), "_sampler": chunks.state_dict()}
        assert (next(chunks)["obs"] == expected[2]).all()
    for saved in (state, {**rb.state_dict(), "_sampler": state["_sampler"]}):
        resumed = stream_buffer()
        resumed.sampler._generator = torch.Generator().manual_seed(99)  # restored from state
        resumed.load_state_dict(saved)
        for want in expected[2:]:
            assert (resumed.sample()["obs"] == want).all()


def test_an_iterable_replay_buffer_source_is_taken_back_too():
    direct = stream_buffer(replacement=False)
    expected = list(direct)  # one epoch
    rb = stream_buffer(replacement=False)
    with ChunkPrefetcher(rb, depth=2) as chunks:
        first = next(chunks)
        wait_until_full(chunks)
    rest = list(rb)
    assert len(rest) == len(expected) - 1
    for want, have in zip(expected, [first, *rest]):
        assert (want["obs"] == have["obs"]).all()


def test_a_dropped_prefetcher_takes_back_its_chunks():
    direct = stream_buffer()
    expected = [direct.sample()["obs"] for _ in range(4)]
    rb = stream_buffer()
    prefetcher = ChunkPrefetcher(rb.sample, depth=2)
    assert (next(prefetcher)["obs"] == expected[0]).all()
    wait_until_full(prefetcher)
    del prefetcher
    gc.collect()
    assert wait_for_no_prefetch_thread()
    for want in expected[1:]:
        assert (rb.sample()["obs"] == want).all()


def test_close_returns_in_bounded_time_when_the_source_blocks():
    entered, release = threading.Event(), threading.Event()

    def stuck_source():  # e.g. a queue no longer fed
        entered.set()
        release.wait()
        return TensorDict({"k": torch.tensor(0)}, [])

    prefetcher = ChunkPrefetcher(stuck_source, depth=1)
    assert entered.wait(30), "the worker never called its source"
    start = time.monotonic()
    with pytest.warns(UserWarning, match=r"still inside a source call after 0.2 s"):
        prefetcher.close(timeout=0.2)
    assert time.monotonic() - start < 2.0
    with pytest.raises(StopIteration):
        next(prefetcher)
    release.set()  # the call returns: the thread ends on its own
    assert wait_for_no_prefetch_thread()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="a device is here")
@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_device_that_is_not_here_is_named_at_construction(device):
    with pytest.raises(ValueError, match=rf"device='{device}' but {device.upper()} is not available"):
        ChunkPrefetcher(counter(), device=device)
    assert not prefetch_threads()


def test_a_worker_left_in_its_source_at_close_draws_nothing_more():
    reference = stream_buffer()
    expected = [reference.sample()["obs"].tolist() for _ in range(5)]
    rb, draws = stream_buffer(), []
    inside, release = threading.Event(), threading.Event()

    def slow_source():
        chunk = rb.sample()
        draws.append(len(draws))
        if len(draws) == 4:  # chunk 3: the worker now stays inside its source after the draw
            inside.set()
            release.wait()
        return chunk

    prefetcher = ChunkPrefetcher(slow_source, depth=1, sampler=rb.sampler)
    got = [next(prefetcher)["obs"].tolist()]
    got.append(next(prefetcher)["obs"].tolist())
    assert inside.wait(30), "the worker never drew chunk 3"
    with pytest.warns(UserWarning, match="still inside a source call"):
        prefetcher.close(timeout=0.1)
    got.append(rb.sample()["obs"].tolist())  # continues chunk 2 at once
    release.set()  # the worker wakes up: it calls its source no more
    assert wait_for_no_prefetch_thread(), "the worker did not end once its source returned"
    assert draws == [0, 1, 2, 3]
    got += [rb.sample()["obs"].tolist() for _ in range(2)]
    assert got == expected


def test_a_second_prefetcher_on_the_same_sampler_is_refused():
    rb = stream_buffer()
    first = ChunkPrefetcher(rb.sample, depth=2)
    try:
        next(first)
        with pytest.raises(ValueError, match="second ChunkPrefetcher draws from this StreamChunkSampler"):
            ChunkPrefetcher(rb.sample)
        with pytest.raises(ValueError, match="second ChunkPrefetcher"):
            ChunkPrefetcher(lambda: rb.sample(), sampler=rb.sampler)
    finally:
        first.close()
    with ChunkPrefetcher(rb, depth=1) as second:  # the first is closed: allowed
        next(second)


def ring_steps(obs, episode_len):
    """Steps with observations ``obs``, cut into episodes of ``episode_len`` steps."""
    obs = torch.as_tensor(list(obs))
    done = ((torch.arange(obs.numel()) + 1) % episode_len == 0).unsqueeze(-1)
    return TensorDict({"obs": obs, ("next", "done"): done}, [obs.numel()])


def ring_of_four_episodes():
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(40), sampler=StreamChunkSampler(1, 4, seed=0), batch_size=4
    )
    rb.extend(ring_steps(range(40), 10))  # four 10-step episodes fill the ring
    return rb


@pytest.mark.parametrize("restore", ["close", "load_state_dict", "loads"])
def test_restoring_a_stream_state_drops_the_steps_overwritten_since(restore, tmp_path):
    rb = ring_of_four_episodes()
    new = ring_steps(range(10_000, 10_040), 40)  # one 40-step episode over the whole ring
    with ChunkPrefetcher(rb.sample, depth=2) as chunks:
        first = next(chunks)["obs"][0].tolist()
        s = first[0]  # the stream's first episode, obs s .. s + 9
        assert s % 10 == 0 and first == [s, s + 1, s + 2, s + 3]
        wait_until_full(chunks)  # drawn ahead: chunks 2, 3 queued, chunk 4 in hand
        rb.extend(new)
        assert next(chunks)["obs"][0].tolist() == [s + 4, s + 5, s + 6, s + 7]  # drawn before
        wait_until_full(chunks)  # the worker drew chunk 5: it read the rewrite
        state = None if restore == "close" else chunks.state_dict()
    # the stream's delivered state still queues obs s + 8, s + 9 of the old episode: their
    # slots now hold 10000 + s + 8 and 10000 + s + 9, so they are dropped and the stream
    # starts the only episode left at its first step
    if restore != "close":
        rb = ring_of_four_episodes()
        rb.extend(new)
        if restore == "load_state_dict":
            rb.sampler.load_state_dict(state)
        else:
            torch.save(state, tmp_path / "stream_chunk_sampler.pt")
            rb.sampler.loads(tmp_path)
    chunk, after = rb.sample(), rb.sample()
    assert chunk["obs"].tolist() == [[10_000, 10_001, 10_002, 10_003]]
    assert chunk["is_first"].squeeze(-1).tolist() == [[True, False, False, False]]
    assert after["obs"].tolist() == [[10_004, 10_005, 10_006, 10_007]]
    assert not after["is_first"].any()


def test_a_prefetcher_without_a_sampler_has_no_state_to_give():
    with ChunkPrefetcher(counter()) as chunks:
        with pytest.raises(ValueError, match="carries no StreamChunkSampler state"):
            chunks.state_dict()
    with pytest.raises(TypeError, match="sampler must be a StreamChunkSampler or None, got int"):
        ChunkPrefetcher(counter(), sampler=3)


def one_long_episode(n, replacement=True):
    """A buffer of one n-step episode, 1 stream of 4 steps: chunk k holds obs 4k .. 4k + 3."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2 * n), batch_size=4, sampler=StreamChunkSampler(
        1, 4, replacement=replacement, generator=torch.Generator().manual_seed(0)))
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[-1] = True
    rb.extend(TensorDict({"obs": torch.arange(n), ("next", "done"): done}, [n]))
    return rb


def test_a_prefetcher_dropped_inside_a_source_call_puts_back_before_the_next_one_draws():
    # the loop drops each prefetcher while its worker is inside a (slow) sample: the next
    # prefetcher must not draw before the dropped one put the sampler back
    rb = one_long_episode(400)

    def slow_sample():
        chunk = rb.sample()
        time.sleep(0.02)  # a slow storage read
        return chunk

    seen = []
    for _ in range(4):
        for i, chunk in enumerate(ChunkPrefetcher(slow_sample, sampler=rb.sampler, depth=2)):
            seen += chunk["obs"][0].tolist()
            if i == 1:
                break
    assert seen == list(range(32))


def test_a_dropped_prefetcher_whose_worker_had_ended_takes_back_its_chunks():
    rb = one_long_episode(24, replacement=False)  # one epoch: 6 chunks, all drawn ahead at depth 8
    for i, _ in enumerate(ChunkPrefetcher(rb, depth=8)):
        wait_for(lambda: not prefetch_threads(), "the worker ending the epoch")
        if i == 1:
            break
    assert [chunk["obs"][0].tolist() for chunk in rb] == [[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19],
                                                           [20, 21, 22, 23]]


def test_a_stream_state_from_before_rb_empty_keeps_no_step_of_the_old_data():
    rb = one_long_episode(40)
    prefetcher = ChunkPrefetcher(rb.sample, depth=2)
    next(prefetcher), next(prefetcher)
    wait_until_full(prefetcher)  # the worker blocked on its queue, not sampling while the buffer is emptied
    state = rb.sampler.stream_state()
    rb.empty()
    done = torch.zeros(40, 1, dtype=torch.bool)
    done[-1] = True
    rb.extend(TensorDict({"obs": 1000 + torch.arange(40), ("next", "done"): done}, [40]))
    prefetcher.close()  # puts back the state of the second chunk: its queued steps were emptied
    chunk = rb.sample()
    assert chunk["obs"].tolist() == [[1000, 1001, 1002, 1003]] and chunk["is_first"][0, 0].item()
    rb.sampler.load_stream_state(state)
    chunk = rb.sample()
    assert chunk["obs"].tolist() == [[1000, 1001, 1002, 1003]] and chunk["is_first"][0, 0].item()


def test_a_chunk_that_cannot_move_to_the_device_is_named_and_a_tensorclass_moves():
    with ChunkPrefetcher(lambda: (torch.zeros(2), torch.ones(2)), device="cpu") as prefetcher:
        with pytest.raises(TypeError, match="the source returned a tuple, which has no to; with device="):
            next(prefetcher)
    from tensordict import tensorclass

    @tensorclass
    class Chunk:
        obs: torch.Tensor

    with ChunkPrefetcher(lambda: Chunk(obs=torch.arange(3), batch_size=[3]), device="cpu") as prefetcher:
        assert next(prefetcher).obs.tolist() == [0, 1, 2]
