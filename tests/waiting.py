"""Waiting in tests for another thread to get somewhere, without betting on a sleep."""
import time


def wait_for(condition, what, seconds=30.0):
    """Polls ``condition()`` until it holds; fails, saying ``what`` never happened, after
    ``seconds`` (a deadline far beyond any normal wait, so a loaded machine passes)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.005)
