"""The influence study's table: one row per epoch, training group and query set of a run's
checkpoints (:data:`CSV_COLUMNS`), written by :func:`~interp_toolkit.studies.influence.measure.run_influence`
and read back by the figures and the verdict engine."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError

__all__ = ["CSV_COLUMNS", "GROUP_ORDER", "QUERY_SETS", "influence_rows", "read_influence_csv", "write_influence_csv"]

QUERY_SETS = ("adv", "val")
GROUP_ORDER = ("consistent", "anti", "anti_memorized", "anti_not_memorized")
CSV_COLUMNS = ("epoch", "phase", "train_group", "query_set", "bif", "stderr", "within", "between",
               "within_stderr", "between_stderr", "phase2_draw_share", "n_examples", "amplification",
               "grad_cos", "adv_acc", "val_acc", "converged", "max_rhat", "min_ess_bulk", "verdict", "climb")


def influence_rows(epoch: int, phase: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The CSV rows (:data:`CSV_COLUMNS`) of one checkpoint's record."""
    conv = record.get("convergence") or {}
    amp = record["amplification"]
    rows = []
    # cache entries are JSON with sorted keys: the groups' order is fixed here, not by the file
    order = {name: i for i, name in enumerate(GROUP_ORDER)}
    for group in sorted(record["groups"], key=lambda g: (order.get(g, len(order)), g)):
        values = record["groups"][group]
        for query in QUERY_SETS:
            entry = values[query]
            rows.append({
                "epoch": epoch, "phase": phase, "train_group": group, "query_set": query,
                "bif": entry["bif"], "stderr": entry["stderr"],
                "within": entry.get("within", float("nan")), "between": entry.get("between", float("nan")),
                "within_stderr": entry.get("within_stderr", float("nan")),
                "between_stderr": entry.get("between_stderr", float("nan")),
                "phase2_draw_share": record["phase2_draw_share"], "n_examples": values["n_examples"],
                "amplification": amp["minority_amplification"], "grad_cos": amp["conflict_cos"],
                "adv_acc": record["accuracy"]["adv"], "val_acc": record["accuracy"]["val"],
                "converged": conv.get("converged"), "max_rhat": conv.get("max_rhat"),
                "min_ess_bulk": conv.get("min_ess_bulk"),
                # the joint gate (records of earlier versions: no locality, so not local)
                "verdict": record.get("sampling_verdict") or ("not converged" if not conv.get("converged")
                                                              else "converged, not local"),
                "climb": (record.get("locality") or {}).get("worst_climb"),
            })
    return rows


def write_influence_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``rows`` as an ``influence.csv`` (:data:`CSV_COLUMNS`), atomically."""
    import io

    from interp_toolkit.io import atomic_write_text

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k) for k in CSV_COLUMNS})
    return atomic_write_text(path, buffer.getvalue())


def read_influence_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of an ``influence.csv`` with numbers parsed (the figures regenerate from these)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist (expected an influence.csv written by interp-toolkit influence)")
    rows = []
    with path.open(newline="") as handle:
        for raw in csv.DictReader(handle):
            row: dict[str, Any] = dict(raw)
            for key in CSV_COLUMNS:
                if key in ("phase", "train_group", "query_set"):
                    continue
                value = row.get(key)
                if key == "converged":
                    row[key] = value == "True"
                elif key == "verdict":
                    row[key] = value or None
                elif key in ("epoch", "n_examples"):
                    row[key] = int(value) if value else None
                else:
                    row[key] = float(value) if value not in (None, "", "None") else float("nan")
            rows.append(row)
    return rows
