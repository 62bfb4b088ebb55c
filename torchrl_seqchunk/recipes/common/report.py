"""The run folder ``<runs_dir>/<name>``: metrics.csv (one row per iteration), a progress bar,
learning_curve.png beside it, and a summary line.

A run counts as finished once its metrics.csv holds a row: a run that failed before it
produced anything does not block the next one, and a refused or failed start leaves an
earlier run's outputs as they were (they are replaced only when the new run's first row is
written). A running run claims its folder (``.running``, its process id): a second run
started on the same folder while the first runs is refused (status 2) instead of writing
into the same metrics.csv; the claim of a process that ended is taken over. TorchRL's ``CSVLogger`` writes one file per scalar under ``scalars/`` and
``generate_exp_name`` adds a date and a random id, so neither gives the one table of a
named, reproducible run folder that the recipes and benchmarks read.
"""
from __future__ import annotations

import atexit
import csv
import dataclasses
import math
import os
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from tensordict import TensorDictBase
from tqdm import tqdm

METRICS, CURVE, CLAIM = "metrics.csv", "learning_curve.png", ".running"
_claimed: set[Path] = set()  # run folders this process claimed, released at exit at the latest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def claim(out_dir: Path) -> None:
    """Marks ``out_dir`` as written by this process; a ValueError if another live process holds it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CLAIM
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            holder = int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            holder = 0
        if holder and holder != os.getpid() and _alive(holder):
            raise ValueError(f"{out_dir} is being written by another run (process {holder}); pass another "
                             "--name or --runs-dir, or wait for that run to end.") from None
        path.write_text(str(os.getpid()))  # the claim of a process that ended
    else:
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
    _claimed.add(out_dir)


@atexit.register
def _release_all() -> None:
    for out_dir in list(_claimed):
        release(out_dir)


def release(out_dir: Path) -> None:
    """Removes this process's claim on ``out_dir`` (nothing if another holds it), and the
    folder if nothing else is in it (a run that wrote no row)."""
    _claimed.discard(out_dir)
    path = out_dir / CLAIM
    try:
        if int(path.read_text().strip() or 0) == os.getpid():
            path.unlink()
            out_dir.rmdir()  # only if empty
    except (OSError, ValueError):
        pass


def finished_returns(steps: TensorDictBase) -> list[float]:
    """The raw returns of the episodes that end in ``steps`` (any batch shape)."""
    done = steps["next", "done"].squeeze(-1)
    return steps["next", "episode_reward"][done].squeeze(-1).tolist()


def finished(out_dir: Path) -> bool:
    """``out_dir`` holds a run that produced something: a metrics.csv with a row below its header."""
    try:
        with open(Path(out_dir) / METRICS, newline="") as f:
            reader = csv.reader(f)
            return next(reader, None) is not None and next(reader, None) is not None
    except FileNotFoundError:
        return False


def evaluation_points(rows: list[dict]) -> list[dict]:
    """A run's evaluations, once each, from its rows (``eval_frames``, ``eval_return`` columns, as
    ``seqchunk sac`` writes them: the last evaluation repeated until the next): a list of
    ``{"frames", "return_mean"}`` by frames; empty for a run without those columns."""
    points = {}
    for r in rows:
        if r.get("eval_frames") and not math.isnan(r.get("eval_return", math.nan)):
            points[int(r["eval_frames"])] = r["eval_return"]
    return [{"frames": f, "return_mean": v} for f, v in sorted(points.items())]


def final_evaluation(points: list[dict]) -> float:
    """The mean return of the last 20% of the evaluation ``points`` (at least one), the final
    figure of pomdp-baselines (Ni et al. 2022); NaN for no point."""
    if not points:
        return math.nan
    last = points[-max(1, math.ceil(0.2 * len(points))):]
    return sum(p["return_mean"] for p in last) / len(last)


def check_run_folder(runs_dir: str, name: str, overwrite: bool) -> Path:
    """``runs_dir/name``; a ValueError if it holds a finished run and ``overwrite`` is False, or if
    ``runs_dir`` or that folder is a file."""
    out_dir = Path(runs_dir) / name
    try:
        for path in (*reversed(out_dir.parents), out_dir):
            if path.exists() and not path.is_dir():
                raise ValueError(f"{path} is a file: pass a --runs-dir (and --name) that is a folder or does not "
                                 "exist.")
        done = finished(out_dir)
    except (OSError, UnicodeDecodeError) as err:  # a name too long, a metrics.csv that is not text, ...
        raise ValueError(f"{out_dir / METRICS}: {err}; pass another --name or --runs-dir.") from None
    if done and not overwrite:
        raise ValueError(f"{out_dir} holds the outputs of an earlier run; pass --name to write "
                         "elsewhere or --overwrite to replace them (from Python: name= or overwrite=True in the "
                         "Config).")
    return out_dir


@dataclasses.dataclass(frozen=True)
class Run:
    """What a recipe's ``train`` returns: the run's folder, its metrics and the files it wrote.

    ``rows``: the rows of ``out_dir/metrics.csv``, one dict per row (column -> int or float;
    NaN where a column has no value yet, such as the mean return before the first episode
    ends); ``files``: the paths written, ``metrics.csv`` first."""
    out_dir: Path
    rows: list[dict]
    files: tuple[Path, ...]

    @property
    def metrics(self) -> Path:
        """``out_dir/metrics.csv``."""
        return self.out_dir / METRICS

    @classmethod
    def read(cls, out_dir: Path, outputs: tuple[str, ...] = (CURVE,)) -> "Run":
        """The Run of a finished run folder, its rows read back from ``metrics.csv`` (numbers
        as the report wrote them: ints stay ints); ``outputs``: its other files, listed where
        they exist. A FileNotFoundError if the folder holds no metrics.csv."""
        out_dir = Path(out_dir)
        with open(out_dir / METRICS, newline="") as f:
            rows = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
        return cls(out_dir, rows, (out_dir / METRICS, *(out_dir / n for n in outputs if (out_dir / n).exists())))


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def plot_curve(rows: list[dict], path: Path, *, target: float | None, return_window: int, title: str) -> None:
    """The mean return by frame (NaN left out), with the target as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r["frames"], r["return_mean"]) for r in rows if not math.isnan(r["return_mean"])]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        ax.plot(*zip(*points))
    if target is not None:  # the target line belongs to the task it was set for
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
        ax.legend(loc="upper left")
    ax.set(xlabel="frames", ylabel=f"mean return, last {return_window} episodes", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Report:
    """One row per iteration in ``out_dir/metrics.csv``, a progress bar, the frames to the
    target, and at the end ``learning_curve.png`` and a summary line.

    Columns: frames, wall_s, episodes, return_mean (mean raw return of the last
    ``return_window`` finished episodes; NaN before the first), then the ``losses`` given to
    :meth:`add`, other than the folder's claim (see the module docstring; a run already
    writing there refuses this one, status 2). ``outputs``: files of the run besides
    metrics.csv and the curve, removed with them when the first row is written."""

    def __init__(self, out_dir: Path, *, planned_frames: int, target: float | None = None,
                 return_window: int = 20, stop_at_target: bool = False, progress: bool = True,
                 outputs: tuple[str, ...] = ()):
        from .options import or_fail  # the recipes' refusal (status 2)

        self.out_dir, self.target, self.stop_at_target = Path(out_dir), target, stop_at_target
        or_fail(claim, self.out_dir)
        self.outputs = (CURVE, *outputs)
        self.returns: deque[float] = deque(maxlen=return_window)
        self.rows, self.frames, self.episodes, self.frames_to_target = [], 0, 0, None
        self.start = time.perf_counter()
        self.bar = tqdm(total=planned_frames, unit="frames", disable=not progress)
        self.file = self.writer = None

    @property
    def reached(self) -> bool:
        """The run should stop: ``stop_at_target`` and the target was reached."""
        return self.stop_at_target and self.frames_to_target is not None

    def add(self, frames: int, returns: list[float], losses: Mapping) -> dict:
        """Counts ``frames`` more frames and the ``returns`` of the episodes that ended in them;
        ``losses``: name -> scalar (tensor or float). Returns the row written."""
        self.frames += frames
        self.returns.extend(returns)
        self.episodes += len(returns)
        return_mean = sum(self.returns) / len(self.returns) if self.returns else float("nan")
        if (self.frames_to_target is None and len(self.returns) == self.returns.maxlen
                and self.target is not None and return_mean >= self.target):
            self.frames_to_target = self.frames
        row = {"frames": self.frames, "wall_s": round(time.perf_counter() - self.start, 2),
               "episodes": self.episodes, "return_mean": return_mean, **{k: float(v) for k, v in losses.items()}}
        self.rows.append(row)
        if self.writer is None:  # the first row replaces an earlier run's outputs
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for name in self.outputs:
                (self.out_dir / name).unlink(missing_ok=True)
            self.file = open(self.out_dir / METRICS, "w", newline="")
            self.writer = csv.DictWriter(self.file, fieldnames=list(row))
            self.writer.writeheader()
        self.writer.writerow(row)
        self.file.flush()
        first_loss = next(iter(losses), None)
        postfix = {"ret": f"{return_mean:.1f}", **({"loss": f"{row[first_loss]:.3f}"} if first_loss else {})}
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(frames)  # one refresh per iteration
        return row

    def close(self, title: str = "") -> Run:
        """Closes the bar and the CSV, draws the curve, prints the summary line and, last (even
        where one of those raises), releases the folder's claim. Returns the Run: its rows and the
        files written so far (none without a row)."""
        self.bar.close()
        try:
            return self._finish(title)
        finally:
            release(self.out_dir)

    def _finish(self, title: str) -> Run:
        if self.file is None:
            return Run(self.out_dir, [], ())
        self.file.close()
        rows = self.rows
        plot_curve(rows, self.out_dir / CURVE, target=self.target, return_window=self.returns.maxlen,
                   title=title or self.out_dir.name)
        seen = [r["return_mean"] for r in rows if not math.isnan(r["return_mean"])]
        reached = "not reached" if self.frames_to_target is None else self.frames_to_target
        target = f"frames_to_{self.target:g}: {reached} " if self.target is not None else ""
        points = evaluation_points(rows)
        evaluated = f"final_eval_return: {final_evaluation(points):.1f} " if points else ""
        print(f"{target}best_return: {max(seen, default=float('nan')):.1f} "
              f"final_return: {rows[-1]['return_mean']:.1f} {evaluated}wall_s: {rows[-1]['wall_s']} -> {self.out_dir}")
        return Run(self.out_dir, rows, (self.out_dir / METRICS, self.out_dir / CURVE))
