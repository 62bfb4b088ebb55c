"""The command line, the benchmark's quick run, and the how-to page's first example."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
from refusals import refused  # tests/refusals.py

from torchrl_seqchunk.check import CHECKS
from torchrl_seqchunk.check.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [
    ["--layout", "mask", "--cell", "lstm"],
    ["--layout", "streams"],
    ["--module", "torchrl", "--layout", "slices", "--burn-in", "2"],
    ["--module", "torchrl", "--layout", "streams", "--cell", "lstm"],  # LSTMModule inside ResetRNN: the carry
])
def test_the_command_line_checks_the_librarys_pipelines(argv, capsys):
    assert main(["CartPole-v1", "--num-envs", "2", "--steps", "48", "--max-episode-steps", "20", *argv]) == 0
    out = capsys.readouterr().out
    for name in CHECKS:
        assert re.search(rf"^{name} +(pass|skip) ", out, re.M), (name, out)
    assert re.search(r"^TIME check_s \d+\.\d+ \(96 steps", out, re.M)


def test_the_module_runs_and_a_continuous_task_passes():
    result = subprocess.run([sys.executable, "-m", "torchrl_seqchunk.check", "Pendulum-v1", "--keep", "0,1",
                             "--num-envs", "2", "--steps", "40"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert re.search(r"^ppo_ratio +pass ", result.stdout, re.M)
    assert "loc, scale" in result.stdout


@pytest.mark.parametrize("argv, says", [
    (["--window", "50", "--steps", "40"], "--window 50 is longer than --steps 40"),
    (["--burn-in", "2"], "--burn-in applies to --layout slices only"),
    (["--num-envs", "0"], "--num-envs must be >= 1"),
])
def test_command_lines_refused_before_any_work(argv, says):
    assert says in " ".join(refused(lambda: main(["CartPole-v1", *argv])).split())


def test_the_benchmark_prints_its_timing_and_ratio_lines(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_check

    figures = bench_check.main(["--quick", "--cells", "gru", "--layouts", "windows"])
    assert set(figures) == {"check_vs_collect_gru_windows"} and figures["check_vs_collect_gru_windows"] > 0
    out = capsys.readouterr().out
    assert re.search(r"^TIME check_128_steps_s_gru_windows \d+\.\d\d$", out, re.M), out
    assert f"RATIO check_vs_collect_gru_windows {figures['check_vs_collect_gru_windows']:.3f}" in out


def test_the_how_to_page_opens_with_a_five_line_check_of_a_users_lstm_module():
    page = (ROOT / "docs" / "howto" / "check.md").read_text()
    first = re.search(r"^```python\n(.*?)^```", page, re.S | re.M).group(1)
    assert "LSTMModule(" in first
    ours = first[first.index("# the check"):].strip().splitlines()[1:]
    assert len(ours) <= 5 and ours[-1] == "report.assert_ok()", ours
