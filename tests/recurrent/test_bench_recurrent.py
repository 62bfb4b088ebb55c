"""benchmarks/bench_recurrent.py runs every code path at its quick size and prints its RATIO lines."""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_recurrent  # noqa: E402


def test_quick_run_prints_every_ratio(capsys):
    bench_recurrent.main(["--quick", "--device", "cpu", "--rounds", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    ratios = dict(re.findall(r"^RATIO (\S+) ([0-9.]+)$", out, re.M))
    for cell in ("gru", "lstm"):
        for backend in ("loop", "packed"):
            assert f"resetrnn_{cell}_{backend}_vs_{cell}_noreset" in ratios
        assert {f"{cell}_gemm_floor_vs_{cell}_noreset", f"resetrnn_{cell}_fused_vs_gemm_floor"} <= set(ratios)
    assert {"resetrnn_vs_gru_noreset", "resetrnn_lstm_vs_lstm_noreset",
            "resetrnn_mingru_scan_vs_gru_noreset"} <= set(ratios)
    assert all(float(value) > 0 for value in ratios.values())
    assert "B=4 T=16" in out
