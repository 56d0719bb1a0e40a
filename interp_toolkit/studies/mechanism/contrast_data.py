"""What a mechanism contrast is: its config (:class:`ContrastConfig`), one run's series
(:class:`RunSeries`), the result (:class:`ContrastResult`), the settings runs may differ in, its
quantities, kinds, files and verdict words. Collecting runs, computing the contrast and reading
it back is :mod:`.contrast`'s; drawing it, :mod:`.contrast_plot`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

#: Quantities a contrast can compare (whole-model gradient statistics of the training split).
QUANTITIES = ("grad_cos", "minority_amplification", "amplification")


#: The paper's two: gradient conflict and the amplification of the minority.
DEFAULT_QUANTITIES = ("grad_cos", "minority_amplification")


#: Ratios, drawn on a log axis.
RATIO_QUANTITIES = ("minority_amplification", "amplification")


#: ``by`` -> (name of the runs that left, name of those that did not).
KINDS: dict[str, tuple[str, str]] = {"generalized": ("generalized", "not generalized"),
                                     "phase2": ("phase 2", "no phase 2")}


#: The files of a contrast folder, each name once.
FILES = {"figure": "contrast.png", "by_epoch": "by_epoch.csv", "windows": "windows.csv", "runs": "runs.csv",
         "summary": "contrast.json"}


VERDICTS = ("distinguishes", "does not distinguish", "too few runs")


LABELS = {"grad_cos": "gradient cosine (consistent vs anti)",
           "minority_amplification": "minority amplification",
           "amplification": "amplification (anti / consistent)"}


@dataclass
class ContrastConfig(Config):
    """Settings of a mechanism contrast.

    Attributes:
        by: How runs are sorted, one grouping or several: generalized (the paper's criterion:
            100% on the split the training bias misleads) and/or phase2 (a phase-2 onset was
            seen, so a run that rose toward the rule but stopped short of 100% counts as
            leaving). Every grouping computed is reported, and Holm runs over every test of
            every grouping together; a grouping that leaves fewer than 2 runs of a kind is
            reported as not computed (a user error when none can be computed).
        quantities: Which to compare, among grad_cos, minority_amplification (the paper's
            amplification of the minority) and amplification (anti / consistent).
        windows: Epoch windows START:END (half-open; END empty: to the end), each one test
            of the family; default: the shortcut phase (from the last run's shortcut epoch
            to the first phase-2 onset of a leaving run; from the first epoch where runs
            have no shortcut, at r = 1/m) and phase 2 on (from that onset to the end), or
            the whole run where a leaving run has no onset.
        alpha: Family-wise level of the verdicts (Holm).
        grad_n: Training examples of the per-example gradients (the mechanism's default, so
            its cache serves).
        grad_chunk_size: Examples per vmap chunk (bounds memory; part of the cache key).
        allow_differing: Settings the runs may differ in besides their seeds (names as the
            refusal prints them, e.g. ``task.n_train``). A contrast of runs of different
            settings compares settings, not outcomes, so it is refused unless every setting
            that differs is named here; the result then records them as confounders.
    """

    by: tuple[Literal["generalized", "phase2"], ...] = ("generalized", "phase2")
    quantities: tuple[str, ...] = DEFAULT_QUANTITIES
    windows: tuple[str, ...] | None = None
    alpha: float = 0.05
    grad_n: int = 2048
    grad_chunk_size: int = 256
    allow_differing: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.allow_differing = tuple(self.allow_differing)
        # a summary written when ``by`` was one name reads back as that one grouping
        self.by = (self.by,) if isinstance(self.by, str) else tuple(self.by)
        self.check("by", bool(self.by) and all(b in KINDS for b in self.by) and len(set(self.by)) == len(self.by),
                   f"distinct names among {', '.join(KINDS)}")
        self.quantities = tuple(self.quantities)
        self.check("quantities", bool(self.quantities) and all(q in QUANTITIES for q in self.quantities)
                   and len(set(self.quantities)) == len(self.quantities),
                   f"distinct names among {', '.join(QUANTITIES)}")
        if self.windows is not None:
            self.windows = tuple(self.windows)
            self.check("windows", bool(self.windows), "at least one START:END window, or unset")
            for text in self.windows:
                parse_window(text)
        self.check("alpha", not isinstance(self.alpha, bool) and isinstance(self.alpha, (int, float))
                   and 0 < self.alpha < 1, "a number in (0, 1)")
        for name in ("grad_n", "grad_chunk_size"):
            value = getattr(self, name)
            self.check(name, not isinstance(value, bool) and isinstance(value, int) and value >= 1,
                       "a positive integer")


def parse_window(text: str) -> tuple[int, int | None]:
    """``"START:END"`` -> ``(start, end)`` epochs, half-open; ``END`` empty -> None (to the end).

    Raises:
        UserError: Not two integers around one colon, or END not after START.
    """
    start_text, colon, end_text = str(text).partition(":")
    try:
        if not colon:
            raise UserError
        start = int(start_text)
        end = int(end_text) if end_text.strip() else None
    except (ValueError, UserError):
        raise UserError(f"window {text!r} must be START:END in epochs (e.g. 50:200, or 200: for 'to the end')") \
            from None
    if start < 0 or (end is not None and end <= start):
        raise UserError(f"window {text!r} must have 0 <= START < END")
    return start, end


@dataclass
class RunSeries:
    """One run's gradient quantities over its checkpoints, and what it did.

    Attributes:
        run_dir: The run directory.
        outcome: Its :func:`~interp_toolkit.studies.common.outcomes.compute_outcome` record.
        r: Its training spurious ratio.
        n_layers: Its layers (for the figure's labels).
        epochs: Checkpoint epochs, ascending.
        values: Quantity -> one value per epoch.
        settings: Everything the run was trained with but its seeds, flat (``task.r``,
            ``model.n_layers``, ``train.lr``, ...: :func:`run_settings`); None in series
            stored before it was recorded.
    """

    run_dir: Path
    outcome: dict[str, Any]
    r: float
    n_layers: int
    epochs: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)
    settings: dict[str, Any] | None = None

    def left(self, by: str) -> bool:
        """Whether the run counts as leaving the shortcut under ``by``."""
        if by == "generalized":
            return bool(self.outcome["generalized"])
        return self.outcome.get("phase2_onset_epoch") is not None or bool(self.outcome["generalized"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; a NaN value is stored as null (strict JSON) and read back as NaN."""
        data = {"run_dir": str(self.run_dir), "outcome": self.outcome, "r": self.r, "n_layers": self.n_layers,
                "epochs": self.epochs,
                "values": {k: [None if math.isnan(v) else v for v in vs] for k, vs in self.values.items()}}
        if self.settings is not None:
            data["settings"] = self.settings
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSeries:
        """The inverse of :meth:`to_dict`; ``ValueError`` / ``KeyError`` / ``TypeError`` on
        what it cannot have written (a value list of another length than the epochs)."""
        epochs = [int(e) for e in data["epochs"]]
        values = {str(k): [math.nan if v is None else float(v) for v in vs] for k, vs in data["values"].items()}
        for name, series in values.items():
            if len(series) != len(epochs):
                raise UserError(f"run {data['run_dir']}: {len(series)} values of {name} for {len(epochs)} epochs")
        settings = data.get("settings")
        return cls(run_dir=Path(data["run_dir"]), outcome=dict(data["outcome"]), r=float(data["r"]),
                   n_layers=int(data["n_layers"]), epochs=epochs, values=values,
                   settings=dict(settings) if settings is not None else None)


@dataclass
class ContrastResult:
    """What :func:`compute_contrast` returns.

    Attributes:
        config: The settings.
        runs: Every run's series.
        groupings: The groupings computed (``config.by`` less those in ``skipped``).
        skipped: Grouping -> why it was not computed (fewer than 2 runs of a kind).
        kinds: Grouping -> ``(leaving, staying)`` names (:data:`KINDS`).
        epochs: The epochs compared (checkpoints every run has).
        windows: Grouping -> ``(name, start, end)`` of each window (end exclusive, None: to
            the end).
        by_epoch: Rows ``grouping, epoch, quantity, mean_<kind>, sd_<kind>, n_<kind>`` for
            both kinds (as ``leaving`` / ``staying``), ``difference, ci_low, ci_high``.
        window_rows: Rows ``grouping, quantity, window, start, end, n_leaving, n_staying,
            mean_leaving, sd_leaving, mean_staying, sd_staying, difference, ci_low, ci_high, p,
            p_holm, smallest_p, verdict``; ``p_holm`` is over every row (the whole family).
        run_rows: Per run: its directory, its kind under each grouping (``kind_<grouping>``),
            outcome epochs and its median per grouping, window and quantity
            (``<quantity>@<grouping>:<window>``).
    """

    config: ContrastConfig
    runs: list[RunSeries]
    groupings: tuple[str, ...]
    skipped: dict[str, str]
    kinds: dict[str, tuple[str, str]]
    epochs: list[int]
    windows: dict[str, list[tuple[str, int, int | None]]]
    by_epoch: list[dict[str, Any]]
    window_rows: list[dict[str, Any]]
    run_rows: list[dict[str, Any]]

    @property
    def confounders(self) -> dict[str, list[Any]]:
        """Settings the runs differ in besides their seeds (allowed by ``allow_differing``)."""
        return differing_settings(self.runs)

    def counts(self) -> list[str]:
        """One line per grouping: how the runs sort under it, or why it was not computed."""
        lines = []
        for by in self.config.by:
            if by in self.skipped:
                lines.append(f"by {by!r}: not computed ({self.skipped[by]})")
                continue
            leaving, staying = self.kinds[by]
            n_left = sum(run.left(by) for run in self.runs)
            lines.append(f"by {by!r}: {n_left} {leaving}, {len(self.runs) - n_left} {staying}")
        return lines

    def verdicts(self) -> list[str]:
        """One line per grouping, window and quantity: the verdict with the numbers behind it
        (and, first, the settings the runs differ in, when they do, and the family's size)."""
        lines = []
        if self.confounders:
            lines.append("confounded: the runs also differ in " + "; ".join(
                f"{name} ({', '.join(repr(v) for v in values)})" for name, values in self.confounders.items()))
        elif self.config.allow_differing and any(run.settings is None for run in self.runs):
            # series stored before runs recorded their settings: what was allowed is all we know
            lines.append("confounded: the runs were allowed to differ in " + ", ".join(self.config.allow_differing)
                         + " (their stored series do not record the settings)")
        tested = sum(math.isfinite(row["p"]) for row in self.window_rows)
        lines.append(f"Holm over the whole family: {tested} tests ({len(self.groupings)} grouping"
                     f"{'s' if len(self.groupings) != 1 else ''} x windows x quantities)")
        for row in self.window_rows:
            leaving, staying = self.kinds[row["grouping"]]
            lines.append(f"[by {row['grouping']}] {row['quantity']} in {row['window']} (epochs "
                         f"{window_label(row['start'], row['end'])}): "
                         f"{leaving} {row['mean_leaving']:.3g} (sd {row['sd_leaving']:.2g}, n {row['n_leaving']}) "
                         f"vs {staying} {row['mean_staying']:.3g} (sd {row['sd_staying']:.2g}, n {row['n_staying']}); "
                         f"difference {row['difference']:+.3g} [{row['ci_low']:+.3g}, {row['ci_high']:+.3g}], "
                         f"permutation p {row['p']:.3g}, Holm {row['p_holm']:.3g}: {row['verdict']}")
        return lines

    def summary(self) -> dict[str, Any]:
        """JSON-able: settings, groupings, kinds, epochs, windows, the window table and every
        run's series."""
        return {"config": self.config.to_dict(), "groupings": list(self.groupings), "skipped": self.skipped,
                "kinds": {by: list(kinds) for by, kinds in self.kinds.items()}, "epochs": self.epochs,
                "windows": {by: [[name, start, end] for name, start, end in windows]
                            for by, windows in self.windows.items()},
                "window_rows": self.window_rows, "runs": [run.to_dict() for run in self.runs]}


def window_label(start: int, end: int | None) -> str:
    """``"100-300"``, or ``"100 on"`` for a window open at its end."""
    return f"{start}-{end}" if end is not None else f"{start} on"


#: Training-config fields that say how a run was computed, not what (never a confounder).
_RUNTIME_FIELDS = frozenset({"seed", "progress", "device", "engine", "eval_batch_size"})


def run_settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a run was trained with but its seeds, flat: ``task.<field>`` (its data, r
    and sizes; not the data seed), ``model.<field>`` (not the init seed) and ``train.<field>``
    (not the seed, device, engine or progress), from its ``run.json``."""
    from interp_toolkit.runs.record import task_dict

    out: dict[str, Any] = {}
    sections = (("task", task_dict(record) or {}), ("model", record.get("model_config") or {}),
                ("train", record.get("train_config") or {}))
    for prefix, section in sections:
        for key, value in sorted(section.items()):
            if key in _RUNTIME_FIELDS:
                continue
            out[f"{prefix}.{key}"] = value
    return out


def differing_settings(runs: Sequence[RunSeries]) -> dict[str, list[Any]]:
    """Settings (:func:`run_settings`) whose value is not the same in every run that records
    them: name -> the distinct values, in the order the runs give them."""
    recorded = [run.settings for run in runs if run.settings is not None]
    out: dict[str, list[Any]] = {}
    for name in sorted({key for settings in recorded for key in settings}):
        values: list[Any] = []
        for settings in recorded:
            value = settings.get(name)
            if value not in values:
                values.append(value)
        if len(values) > 1:
            out[name] = values
    return out


__all__ = ["QUANTITIES", "DEFAULT_QUANTITIES", "RATIO_QUANTITIES", "KINDS", "FILES", "VERDICTS", "LABELS",
           "ContrastConfig", "parse_window", "RunSeries", "ContrastResult", "window_label", "run_settings",
           "differing_settings"]
