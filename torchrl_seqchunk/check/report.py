"""What a recurrence check returns: one result per named check, printed as a table."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CheckResult", "RecurrenceReport"]

PASS, FAIL, SKIP = "pass", "FAIL", "skip"


@dataclass
class CheckResult:
    """The outcome of one named check.

    Attributes:
        name (str): the check (``"step_vs_sequence"``, ``"ppo_ratio"``, ``"stored_memory"``,
            ``"resets"``, ``"done_alignment"``, ``"carry"``).
        status (str): ``"pass"``, ``"FAIL"`` or ``"skip"``.
        checked (int): how many slots (or steps) the check compared.
        first (tuple of int, optional): the first offending ``(env, t)`` of the rollout, by row
            then time; ``None`` where nothing failed.
        difference (float, optional): the largest absolute difference the check measured (over
            the failing slots where it failed, else over all); ``None`` where it compared nothing.
        note (str): what was compared, or what failed and its likely cause.

    Examples:
        >>> result = CheckResult("stored_memory", "FAIL", 1000, (2, 17), 0.25, "stored after the step")
        >>> result.failed, result.first
        (True, (2, 17))
    """

    name: str
    status: str
    checked: int = 0
    first: tuple | None = None
    difference: float | None = None
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass
class RecurrenceReport:
    """The results of :func:`~torchrl_seqchunk.check.check_recurrence`, one per check, in order.

    ``str(report)`` is a table (check, result, slots, first offending ``(env, t)``, largest
    difference, note); :attr:`ok` is True when no check failed (skipped ones do not fail);
    :meth:`assert_ok` raises an AssertionError listing the failures, for a test suite.

    Attributes:
        results (list of CheckResult): one per check run or skipped.
        summary (str): the rollout and the layout checked, one line.

    Examples:
        >>> report = RecurrenceReport([CheckResult("resets", "pass", 12, difference=0.0),
        ...                            CheckResult("carry", "skip", note="the layout carries no state")],
        ...                           summary="2 x 6 steps, windows of 3")
        >>> report.ok, report["resets"].checked
        (True, 12)
        >>> print(report)  # doctest: +NORMALIZE_WHITESPACE
        recurrence check: 2 x 6 steps, windows of 3
        check   result  slots  first (env, t)  max diff  note
        resets  pass    12     -               0
        carry   skip    -      -               -         the layout carries no state
        >>> RecurrenceReport([CheckResult("resets", "FAIL", 12, (0, 4), 0.5, "memory crosses")]).assert_ok()
        Traceback (most recent call last):
        ...
        AssertionError: recurrence check failed: resets at (env, t) = (0, 4), difference 0.5: memory crosses
    """

    results: list = field(default_factory=list)
    summary: str = ""

    def __getitem__(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; the report holds {[r.name for r in self.results]}.")

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not self.failures

    @property
    def failures(self) -> list:
        """The failed :class:`CheckResult` entries."""
        return [r for r in self.results if r.failed]

    def assert_ok(self) -> None:
        """Raises AssertionError naming every failed check, its first ``(env, t)``, its difference
        and its note (the whole table follows); returns None when all passed or were skipped."""
        if self.ok:
            return
        lines = [f"{r.name} at (env, t) = {r.first}, difference {_number(r.difference)}: {r.note}"
                 for r in self.failures]
        message = "recurrence check failed: " + "; ".join(lines)
        if len(self.results) > 1:
            message += "\n" + str(self)
        raise AssertionError(message)

    def __str__(self) -> str:
        header = ("check", "result", "slots", "first (env, t)", "max diff", "note")
        rows = [header] + [
            (r.name, r.status, "-" if r.status == SKIP else str(r.checked),
             "-" if r.first is None else str(tuple(r.first)), _number(r.difference), r.note)
            for r in self.results
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]
        lines = [line.rstrip() for line in lines]
        return "\n".join(([f"recurrence check: {self.summary}"] if self.summary else []) + lines)


def _number(value) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.3g}"
