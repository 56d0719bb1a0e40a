"""The language-model claim series: class-to-class influence across checkpoints and seeds,
their CSV (the committed record figures regenerate from) and one figure per claim.

A *claim* is a class pair ``"A->B"`` (influence of class-A training tokens on class-B query
tokens) or a difference ``"A->B - C->D"``
(:mod:`interp_toolkit.analyses.bif.claims`). The CSV has one row per (training seed,
checkpoint step, claim), columns :data:`CLAIM_CSV_FIELDS`:

* ``step``, ``seed`` (the training seed of the run the checkpoint comes from);
* ``series`` (the claim's name), ``source_class``, ``target_class`` (its first pair),
  ``minus`` (the subtracted pair, empty for a plain influence);
* ``bif`` (pooled ``-Cov``), ``stderr`` (leave-one-chain-out jackknife), ``rhat`` (split
  R-hat), ``ess`` (``min(bulk, tail)`` ESS over all chains);
* ``induction_score`` (max-head prefix-matching attention at that checkpoint).

Figures are drawn from these rows only (:func:`claim_figure_data` then :func:`plot_claim`),
so ``read_claims_csv`` + :func:`write_claim_figures` regenerates them exactly.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_text

#: The record of a claims study's testbed and sampler, written beside its merged
#: ``claims.csv`` (:func:`interp_toolkit.studies.lm.claims_study.report_claims`), read by the
#: verdicts (:mod:`interp_toolkit.studies.verdicts.bif`).
CLAIMS_STUDY_JSON = "claims_study.json"

__all__ = [
    "CLAIMS_STUDY_JSON", "CLAIM_CSV_FIELDS", "MIN_MEASURED_RISE", "MIN_Z", "claim_figure_data", "claim_peaks",
    "claim_rows", "plot_claim", "read_claims_csv", "rise_and_fall", "sign_change", "write_claim_figures",
    "write_claims_csv",
]

CLAIM_CSV_FIELDS = ["step", "seed", "series", "source_class", "target_class", "minus", "bif", "stderr", "rhat",
                    "ess", "induction_score"]
_FLOATS = ("bif", "stderr", "rhat", "ess", "induction_score")
#: Written after CLAIM_CSV_FIELDS, optional when read (files of earlier versions lack them): the
#: locality gate of the checkpoint's draws (analyses.bif.locality): the worst chain's climb as a
#: fraction of the loss gap, and whether it passed ("" when unmeasured).
CLAIM_LOCALITY_FIELDS = ["climb", "local"]
#: A seed's induction transition is shaded only when its induction score rose by at least this
#: much between its first checkpoint and its maximum (else no transition was measured).
MIN_MEASURED_RISE = 0.2


def claim_rows(influences: Sequence[Any], *, step: int, seed: int, induction_score: float,
               locality: Any = None) -> list[dict[str, Any]]:
    """CSV rows of one checkpoint's :class:`~interp_toolkit.analyses.bif.claims.ClassInfluence`
    list; ``locality`` is that checkpoint's :class:`~interp_toolkit.analyses.bif.locality.Locality`."""
    climb = float("nan") if locality is None else float(locality.worst_climb)
    local = None if locality is None or not math.isfinite(climb) else bool(locality.local)
    return [{"step": int(step), "seed": int(seed), "series": inf.name, "source_class": inf.source,
             "target_class": inf.target, "minus": inf.minus or "", "bif": inf.bif, "stderr": inf.stderr,
             "rhat": inf.rhat, "ess": inf.ess, "induction_score": float(induction_score), "climb": climb,
             "local": local} for inf in influences]


def write_claims_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows (sorted by series, seed, step) atomically; floats as ``repr`` (exact)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CLAIM_CSV_FIELDS + CLAIM_LOCALITY_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in sorted(rows, key=lambda r: (str(r["series"]), int(r["seed"]), int(r["step"]))):
        local = row.get("local")
        writer.writerow({**{k: repr(float(row[k])) if k in _FLOATS else row[k] for k in CLAIM_CSV_FIELDS},
                         "climb": repr(float(row.get("climb", float("nan")))),
                         "local": "" if local is None else str(bool(local))})
    path = Path(path)
    atomic_write_text(path, buffer.getvalue())
    return path


def read_claims_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a claims CSV, typed (ints, floats; ``minus`` ``None`` when empty).

    Raises:
        UserError: Missing file or columns, or a value that does not parse (names the row).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"claims CSV {str(path)!r} does not exist")
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in CLAIM_CSV_FIELDS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"claims CSV {str(path)!r} lacks columns {missing}; expected {CLAIM_CSV_FIELDS}")
        rows = []
        for number, raw in enumerate(reader, start=2):
            try:
                row: dict[str, Any] = {"step": int(raw["step"]), "seed": int(raw["seed"]), "series": raw["series"],
                                       "source_class": raw["source_class"], "target_class": raw["target_class"],
                                       "minus": raw["minus"] or None}
                row.update({k: float(raw[k]) for k in _FLOATS})
                row["climb"] = float(raw.get("climb") or "nan")
                local = raw.get("local") or ""
                if local not in ("", "True", "False"):
                    raise ValueError(f"local must be True, False or empty, got {local!r}")
                row["local"] = None if local == "" else local == "True"
            except (TypeError, ValueError) as err:
                raise UserError(f"claims CSV {str(path)!r} line {number}: {err}") from err
            rows.append(row)
    return rows


def claim_figure_data(rows: Sequence[Mapping[str, Any]], series: str) -> dict[str, Any]:
    """Everything :func:`plot_claim` draws for one claim, from CSV rows.

    Returns:
        ``{"series", "seeds": {seed: {"steps", "bif", "stderr", "induction_score", "converged",
        "local", "transition": (start, end) | None}}}``; ``converged`` is each point's R-hat <= 1.01
        and ESS >= 100 (the toolkit's rule); ``local`` its locality gate (None: unmeasured, a CSV
        of an earlier version); ``transition`` is the 10%-90% window of the
        induction score's rise (:func:`~interp_toolkit.studies.lm.testbed.induction_phases`)
        where the rise is at least :data:`MIN_MEASURED_RISE`.

    Raises:
        ValueError: No rows of that series (names the series there are).
    """
    from interp_toolkit.studies.lm.testbed import induction_phases

    selected = [r for r in rows if r["series"] == series]
    if not selected:
        raise UserError(f"no rows of series {series!r}; the rows have {sorted({r['series'] for r in rows})}")
    seeds: dict[int, dict[str, Any]] = {}
    for seed in sorted({int(r["seed"]) for r in selected}):
        points = sorted(((int(r["step"]), float(r["bif"]), float(r["stderr"]), float(r["induction_score"]),
                          _converged(r), r.get("local")) for r in selected if int(r["seed"]) == seed),
                        key=lambda p: p[0])
        steps = [p[0] for p in points]
        scores = [p[3] for p in points]
        transition = None
        if len(steps) >= 2:
            phases = induction_phases(steps, scores)
            if phases["rise"] >= MIN_MEASURED_RISE:
                transition = (phases["start"], phases["end"])
        seeds[seed] = {"steps": steps, "bif": [p[1] for p in points], "stderr": [p[2] for p in points],
                       "induction_score": scores, "transition": transition, "converged": [p[4] for p in points],
                       "local": [p[5] for p in points]}
    return {"series": series, "seeds": seeds}


def _converged(row: Mapping[str, Any]) -> bool:
    """R-hat <= 1.01 and ESS >= 100 (a NaN fails)."""
    from interp_toolkit.analyses.bif.diagnostics import ESS_MIN, RHAT_MAX

    rhat, ess = float(row["rhat"]), float(row["ess"])
    return bool(rhat <= RHAT_MAX and ess >= ESS_MIN)


def _metric_label(series: str) -> str:
    first, _, minus = series.partition(" - ")
    source, _, target = first.partition("->")
    text = f"influence of {source} training tokens on {target} query tokens"
    if minus:
        text = f"[{first}] minus [{minus}]"
    return f"{text}\n(BIF = -Cov of the classes' mean losses; +-1 jackknife s.e.)"


def plot_claim(data: Mapping[str, Any], ax: Any = None) -> Any:
    """One claim's series over training steps: a line with a +-1 stderr band per training
    seed, the induction score on a twin axis (dashed, same colour), each seed's measured
    transition window shaded (none where no transition was measured); legend outside the axes.

    Args:
        data: :func:`claim_figure_data` output.
        ax: Optional axes to draw into.

    Returns:
        The matplotlib ``Figure``.
    """
    from interp_toolkit.plotting import new_figure, style

    with style():
        fig, ax = new_figure(ax, figsize=(9.5, 4.6))
        twin = ax.twinx()
        colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
        for index, (seed, s) in enumerate(sorted(data["seeds"].items())):
            color = colors[index % len(colors)]
            low = [b - (0.0 if math.isnan(e) else e) for b, e in zip(s["bif"], s["stderr"])]
            high = [b + (0.0 if math.isnan(e) else e) for b, e in zip(s["bif"], s["stderr"])]
            ax.plot(s["steps"], s["bif"], marker="o", ms=3, lw=1.3, color=color, label=f"BIF, training seed {seed}")
            ax.fill_between(s["steps"], low, high, color=color, alpha=0.2, lw=0)
            unconverged = [i for i, ok in enumerate(s.get("converged") or []) if not ok]
            if unconverged:  # an estimate whose chains failed the R-hat / ESS rule is drawn hollow
                ax.plot([s["steps"][i] for i in unconverged], [s["bif"][i] for i in unconverged], ls="none",
                        marker="o", ms=6, mfc="white", mec=color, mew=1.2,
                        label=f"not converged (R-hat > 1.01 or ESS < 100), seed {seed}")
            far = [i for i, local in enumerate(s.get("local") or []) if local is False]
            if far:  # draws that left the checkpoint's solution: a hollow square
                ax.plot([s["steps"][i] for i in far], [s["bif"][i] for i in far], ls="none", marker="s", ms=8,
                        mfc="none", mec=color, mew=1.2,
                        label=f"not local (draws climbed > 10% of the loss gap), seed {seed}")
            twin.plot(s["steps"], s["induction_score"], ls="--", lw=1.1, color=color,
                      label=f"induction score, seed {seed}")
            if s["transition"] is not None:
                start, end = s["transition"]
                ax.axvspan(start, end, color=color, alpha=0.08, lw=0,
                           label=f"induction transition (10-90% of rise), seed {seed}")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("training step")
        ax.set_ylabel(_metric_label(data["series"]), fontsize=8)
        twin.set_ylabel("induction score (max-head prefix-matching attention)", fontsize=8)
        twin.set_ylim(0, 1)
        twin.grid(False)
        lines, labels = ax.get_legend_handles_labels()
        lines2, labels2 = twin.get_legend_handles_labels()
        ax.legend(lines + lines2, labels + labels2, fontsize=7, loc="upper left", bbox_to_anchor=(1.1, 1.0),
                  borderaxespad=0.0)
        ax.set_title(f"{data['series']} across checkpoints", fontsize=10)
    return fig


def _file_name(series: str) -> str:
    return "claim_" + re.sub(r"[^A-Za-z0-9]+", "_", series.replace("->", "_to_").replace(" - ", "_minus_")).strip("_")


def write_claim_figures(rows: Sequence[Mapping[str, Any]], out_dir: str | Path,
                        figure_format: str = "png") -> list[Path]:
    """One figure per series of the rows, ``out_dir/claim_<series>.<format>``."""
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)
    out = Path(out_dir)
    paths = []
    for series in dict.fromkeys(r["series"] for r in rows):
        paths.append(save_figure(plot_claim(claim_figure_data(rows, series)),
                                 out / f"{_file_name(series)}.{figure_format}"))
    return paths


def claim_peaks(rows: Sequence[Mapping[str, Any]], series: str) -> list[dict[str, Any]]:
    """Per seed: the checkpoint where ``|bif|`` is largest, with its stderr, relative error,
    R-hat and ESS (what the docs quote)."""
    out = []
    for seed in sorted({int(r["seed"]) for r in rows if r["series"] == series}):
        mine = [r for r in rows if r["series"] == series and int(r["seed"]) == seed]
        peak = max(mine, key=lambda r: abs(float(r["bif"])))
        bif, stderr = float(peak["bif"]), float(peak["stderr"])
        out.append({"seed": seed, "step": int(peak["step"]), "bif": bif, "stderr": stderr,
                    "relative_error": stderr / abs(bif) if bif else math.inf, "rhat": float(peak["rhat"]),
                    "ess": float(peak["ess"]), "induction_score": float(peak["induction_score"])})
    return out


#: A change counts as measured when it is at least this many standard errors from zero.
MIN_Z = 2.0


def _series_by_seed(rows: Sequence[Mapping[str, Any]], series: str) -> dict[int, list[Mapping[str, Any]]]:
    """The rows of ``series`` per training seed (seeds ascending), each in step order."""
    by_seed: dict[int, list[Mapping[str, Any]]] = {}
    for row in sorted((r for r in rows if r["series"] == series), key=lambda r: (int(r["seed"]), int(r["step"]))):
        by_seed.setdefault(int(row["seed"]), []).append(row)
    if not by_seed:
        raise UserError(f"no rows of series {series!r} (have: {sorted({r['series'] for r in rows})})")
    return by_seed


def _change(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float, float]:
    """``|b| - |a|`` with its error and z. Checkpoints are sampled by independent chains, so the
    two errors add in quadrature."""
    delta = abs(float(b["bif"])) - abs(float(a["bif"]))
    err = math.hypot(float(a["stderr"]), float(b["stderr"]))
    if err > 0:
        return delta, err, delta / err
    return delta, err, math.copysign(math.inf, delta) if delta else 0.0  # exact values: no change is z 0


def rise_and_fall(rows: Sequence[Mapping[str, Any]], series: str, min_z: float = MIN_Z) -> list[dict[str, Any]]:
    """Per seed, does ``|bif|`` rise to a peak and fall after it?

    The peak is the checkpoint of largest ``|bif|``; *rise* = ``|peak| - |first|``, *fall* =
    ``|peak| - |last|``, each with its error (quadrature of the two checkpoints' jackknife errors)
    and z. ``verdict``: ``"rise and fall"`` when both are at least ``min_z`` standard errors,
    ``"rise, no measured fall"`` when only the rise is (``"rise, fall not tested (peak at the
    last checkpoint)"`` when no checkpoint comes after the peak, so no fall could be seen),
    ``"no measured rise"`` otherwise. The peak is chosen on the same noisy values, so both z are
    somewhat optimistic; a seed whose peak is its last checkpoint has fall 0.

    Raises:
        UserError: if ``series`` has no rows.
    """
    out = []
    for seed, mine in _series_by_seed(rows, series).items():
        peak = max(mine, key=lambda r: abs(float(r["bif"])))
        rise, rise_err, rise_z = _change(mine[0], peak)
        fall, fall_err, fall_z = _change(mine[-1], peak)
        verdict = ("no measured rise" if rise_z < min_z else
                   "rise and fall" if fall_z >= min_z else
                   # no checkpoint after the peak: a fall could not have been seen
                   "rise, fall not tested (peak at the last checkpoint)" if peak is mine[-1] else
                   "rise, no measured fall")
        out.append({"seed": seed, "first_step": int(mine[0]["step"]), "peak_step": int(peak["step"]),
                    "last_step": int(mine[-1]["step"]), "peak_bif": float(peak["bif"]),
                    "peak_stderr": float(peak["stderr"]), "rise": rise, "rise_stderr": rise_err, "rise_z": rise_z,
                    "fall": fall, "fall_stderr": fall_err, "fall_z": fall_z, "verdict": verdict})
    return out


def sign_change(rows: Sequence[Mapping[str, Any]], series: str, min_z: float = MIN_Z) -> list[dict[str, Any]]:
    """Per seed, does ``bif`` take both signs, each measured (``|bif| >= min_z * stderr``)?

    For a difference series such as ``"open->close - close->open"`` this is the claim that the
    two delimiters change sign relative to each other. Returns per seed the most positive and
    the most negative checkpoint by z (``bif / stderr``), and ``verdict``: ``"sign change"``
    (both measured), ``"one sign"`` (only one is), ``"no measured sign"``; ``order`` says which
    sign came first when both are measured.

    Raises:
        UserError: if ``series`` has no rows.
    """
    out = []
    for seed, mine in _series_by_seed(rows, series).items():

        def z(row: Mapping[str, Any]) -> float:
            return float(row["bif"]) / float(row["stderr"]) if float(row["stderr"]) > 0 else 0.0

        top, bottom = max(mine, key=z), min(mine, key=z)
        positive, negative = z(top) >= min_z, z(bottom) <= -min_z
        entry: dict[str, Any] = {"seed": seed, "max_step": int(top["step"]), "max_bif": float(top["bif"]),
                                 "max_stderr": float(top["stderr"]), "max_z": z(top),
                                 "min_step": int(bottom["step"]), "min_bif": float(bottom["bif"]),
                                 "min_stderr": float(bottom["stderr"]), "min_z": z(bottom)}
        entry["verdict"] = ("sign change" if positive and negative else
                            "one sign" if positive or negative else "no measured sign")
        entry["order"] = (("+ then -" if int(top["step"]) < int(bottom["step"]) else "- then +")
                          if positive and negative else "")
        out.append(entry)
    return out
