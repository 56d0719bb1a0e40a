"""A run's evaluation history (``RUN_DIR/metrics.jsonl``), read back checked.

Every trainer appends one JSON line per evaluation: ``{"epoch", "<split>_loss",
"<split>_acc", ...}``. What is read back must be what a trainer can have written: each line
a JSON object, epochs integers that increase from line to line, accuracies in [0, 1] and
losses finite and non-negative. :func:`read_metrics` raises :class:`MetricsError` naming
the file and the line otherwise (a hand-edited ``"adv_acc": 1.19`` would change a run's
outcome). The one line it skips is a last line without its newline that is not JSON: a
line being appended right now, or torn by a crash.

On resume, :func:`repair_for_resume` keeps the history up to the saved state: lines after
it, a torn last line and anything after a bad line are dropped (the trainer recomputes
them), evaluations missing before the saved epoch are restored from the run's own
checkpoints' metadata (digest-verified) where there is one, and the number of lines
dropped or restored is reported; a history that cannot be made whole refuses the resume.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import read_utf8
from interp_toolkit.runs.layout import METRICS, checkpoint_path, metrics_path

METRICS_NAME = METRICS


class MetricsError(UserError):
    """A ``metrics.jsonl`` line is not what a trainer writes (names the file and the line)."""


def row_problem(row: Any, previous_epoch: int | None) -> str | None:
    """Why ``row`` cannot be an evaluation line following ``previous_epoch`` (None: it can)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, expected an object"
    epoch = row.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return f"epoch {epoch!r}, expected a non-negative integer"
    if previous_epoch is not None and epoch <= previous_epoch:
        return f"epoch {epoch} after epoch {previous_epoch}, expected increasing epochs"
    for key, value in sorted(row.items()):
        if not (key.endswith("_acc") or key.endswith("_loss")):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{key} {value!r}, expected a finite number"
        if key.endswith("_acc") and not 0.0 <= value <= 1.0:
            return f"{key} {value!r}, expected an accuracy in [0, 1]"
        if key.endswith("_loss") and value < 0:
            return f"{key} {value!r}, expected a non-negative loss"
    return None


@dataclass
class _Scan:
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: (line number, why) of the first line that is not a valid evaluation; None if none.
    bad: tuple[int, str] | None = None
    lines: int = 0
    torn_last: bool = False


def _scan(path: Path) -> _Scan:
    """Read ``path``'s lines up to the first invalid one."""
    scan = _Scan()
    if not path.exists():
        return scan
    text = read_utf8(path, "a metrics.jsonl a trainer wrote", MetricsError)
    lines = text.split("\n")
    complete = text.endswith("\n") or text == ""
    if lines and lines[-1] == "":
        lines.pop()
    scan.lines = len(lines)
    previous = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            scan.bad = (number, "an empty line")
            break
        last_unterminated = number == len(lines) and not complete
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if last_unterminated:
                scan.torn_last = True
            else:
                scan.bad = (number, f"not JSON ({err.msg})")
            break
        problem = row_problem(row, previous)
        if problem is not None:
            scan.bad = (number, problem)
            break
        scan.rows.append(row)
        previous = row["epoch"]
    return scan


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every evaluation of a ``metrics.jsonl``, checked (``[]`` if the file is absent).

    A last line without its newline that is not JSON (being appended, or torn by a crash)
    is left out.

    Raises:
        MetricsError: Naming the file and the line that is not JSON, not an object, or has an
            accuracy outside [0, 1], a non-finite or negative loss, or an epoch that does not
            increase; or if the file is not UTF-8.
    """
    path = Path(path)
    scan = _scan(path)
    if scan.bad is not None:
        number, why = scan.bad
        raise MetricsError(f"{path} line {number}: {why}; the file is not the evaluation history a trainer "
                           f"wrote (restore it, or rerun the run with --overwrite)")
    return scan.rows


def repair_for_resume(run_dir: str | os.PathLike, epoch: int, evaluation_epochs: Sequence[int],
                      ) -> tuple[list[dict[str, Any]], str | None]:
    """The history a run resuming from its state at ``epoch`` continues, and a one-line
    notice of what was dropped or restored (None when the file was already that history).

    Lines after ``epoch``, a torn last line and everything from the first bad line on are
    dropped; scheduled evaluations (``evaluation_epochs``) up to ``epoch`` that are then
    missing are restored from the metadata of the run's checkpoint of that epoch.

    Raises:
        MetricsError: If an evaluation up to ``epoch`` is missing and has no checkpoint to
            restore it from (the state cannot be resumed exactly).
    """
    from interp_toolkit.checkpoint import CheckpointError, read_checkpoint

    run_dir = Path(run_dir)
    path = run_dir / METRICS_NAME
    scan = _scan(path)
    by_epoch = {int(row["epoch"]): row for row in scan.rows if int(row["epoch"]) <= epoch}
    wanted = sorted(e for e in set(evaluation_epochs) if e <= epoch)
    restored = []
    for missing in (e for e in wanted if e not in by_epoch):
        try:
            _, _, metadata = read_checkpoint(checkpoint_path(run_dir, missing))
        except CheckpointError:
            metadata = {}
        row = metadata.get("metrics")
        if not isinstance(row, dict) or row.get("epoch") != missing or row_problem(row, None) is not None:
            why = f"line {scan.bad[0]} is bad ({scan.bad[1]})" if scan.bad else "it has no line for it"
            raise MetricsError(
                f"{path} lacks the evaluation of epoch {missing} ({why}), and the run's resume state is at "
                f"epoch {epoch}: the history cannot be made whole (no checkpoint of epoch {missing} records it). "
                f"Restore the file, or rerun with --overwrite to train the run again")
        by_epoch[missing] = row
        restored.append(missing)
    kept = [by_epoch[e] for e in sorted(by_epoch)]
    dropped = scan.lines - sum(1 for row in scan.rows if int(row["epoch"]) <= epoch)
    if not dropped and not restored:
        return kept, None
    parts = []
    if dropped:
        reasons = []
        if scan.bad:
            reasons.append(f"line {scan.bad[0]}: {scan.bad[1]}")
        if scan.torn_last:
            reasons.append("a torn last line")
        later = sum(1 for row in scan.rows if int(row["epoch"]) > epoch)
        if later:
            reasons.append(f"{later} after the saved epoch {epoch}")
        parts.append(f"dropped {dropped} line(s) ({'; '.join(reasons)})")
    if restored:
        parts.append(f"restored the evaluation(s) of epoch(s) {restored} from the run's checkpoints")
    return kept, f"{path}: {', '.join(parts)}; resuming from epoch {epoch}"


def read_run_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every evaluation logged in ``run_dir`` (:func:`read_metrics` of its ``metrics.jsonl``);
    empty when nothing is logged yet, and a line being appended now is left out."""
    path = metrics_path(run_dir)
    return read_metrics(path) if path.exists() else []


__all__ = ["METRICS_NAME", "MetricsError", "read_metrics", "read_run_metrics", "repair_for_resume", "row_problem"]
