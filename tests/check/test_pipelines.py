"""Every pipeline of the library and of TorchRL passes; every broken one fails the check that names
its bug, and the checks that describe its symptom, and no other."""
import pytest
from pipelines import BROKEN, CORRECT, FIXED, STEPS  # tests/check/pipelines.py

from torchrl_seqchunk.check import CHECKS, check_recurrence

PASSING = {**CORRECT, **FIXED}


def run(build):
    policy, env, layout, options = build()
    try:
        return check_recurrence(policy, env, layout, steps=STEPS, **options), layout, options
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(PASSING))
def test_correct_pipelines_pass_every_check(name):
    report, layout, options = run(PASSING[name])
    report.assert_ok()
    status = {r.name: r.status for r in report.results}
    assert [r.name for r in report.results] == list(CHECKS)
    for check in ("step_vs_sequence", "stored_memory", "resets", "done_alignment"):
        assert status[check] == "pass" and report[check].checked > 0, (check, report)
    assert status["ppo_ratio"] == ("pass" if "ppo_loss" in options else "skip")
    assert status["carry"] == ("pass" if layout.carries else "skip")
    assert "episode boundaries probed" in report["resets"].note and " 0 of " not in report["resets"].note


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_pipeline_fails_the_check_that_names_its_bug_and_no_other(name):
    build, naming, expected = BROKEN[name]
    report, _, _ = run(build)
    failed = {r.name for r in report.failures}
    assert naming in failed, report
    assert failed == expected, report
    for result in report.failures:
        assert result.first is not None and result.difference > 1e-3, result
    with pytest.raises(AssertionError, match=f"{naming} at \\(env, t\\) = \\(\\d+, \\d+\\)"):
        report.assert_ok()


def test_every_bug_class_is_named_by_a_check_of_its_own():
    assert {naming for _, naming, _ in BROKEN.values()} == {"done_alignment", "resets", "stored_memory", "carry",
                                                            "ppo_ratio"}
    # step_vs_sequence is the symptom: every recurrence bug shows there, the ratio's does not
    assert all("step_vs_sequence" in expected for name, (_, _, expected) in BROKEN.items()
               if name != "exploration_after_log_prob")
