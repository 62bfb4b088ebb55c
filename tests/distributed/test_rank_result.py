"""benchmarks/timing.rank_zero_result: the figure of rank 0 comes back, whatever the ranks do after it."""
import sys
import time
from pathlib import Path

import pytest
import stuck_ranks
from torch.multiprocessing import ProcessRaisedException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import rank_zero_result  # noqa: E402

pytestmark = pytest.mark.distributed


def test_ranks_stuck_after_the_result_are_terminated_with_a_warning():
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="still tearing down 1 s after rank 0's result"):
        assert rank_zero_result(stuck_ranks.puts_then_hangs, 2, None, teardown_s=1.0) == 42.0
    assert time.monotonic() - start < 60  # not the rank's 600 s


def test_a_rank_that_raises_fails_the_call():
    with pytest.raises(ProcessRaisedException, match="rank 1 failed"):
        rank_zero_result(stuck_ranks.rank_one_raises, 2, None)


def test_no_result_is_an_error_not_a_wait():
    with pytest.raises(RuntimeError, match="rank 0 put no result"):
        rank_zero_result(stuck_ranks.puts_nothing, 2, None)
