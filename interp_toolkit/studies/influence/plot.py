"""Figures of the joined influence study (:mod:`interp_toolkit.studies.influence.measure`): one run's
group influence across training with its phases shaded (:func:`plot_influence`) and several
runs side by side (:func:`plot_influence_summary`), drawn from the study's CSV rows alone."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from interp_toolkit.errors import UserError

_GROUP_COLORS = {"anti": "tab:red", "consistent": "tab:blue", "anti_memorized": "tab:purple",
                 "anti_not_memorized": "tab:pink"}


def plot_influence(rows: Sequence[Mapping[str, Any]], outcome: Mapping[str, Any] | None = None,
                   query_set: str = "adv", title: str | None = None) -> Any:
    """Group influence on one query set vs epoch (log axis), phases shaded, the gradient
    amplification in a panel beside it (same epoch axis).

    Args:
        rows: :data:`~interp_toolkit.studies.influence.table.CSV_COLUMNS` rows
            (:func:`~interp_toolkit.studies.influence.table.read_influence_csv` or ``InfluenceResult.rows``).
        outcome: The run's outcome record (phase shading; default: from the rows' ``phase``).
        query_set: ``adv`` or ``val``.
        title: Figure title (e.g. the run's name).
    """
    from interp_toolkit.plotting import new_panels, style

    measured = sorted({row["query_set"] for row in rows})
    if query_set not in measured:
        raise UserError(f"query_set must be one of the rows' query sets {measured}, got {query_set!r}")
    with style():
        fig, (left, right) = new_panels(2, ncols=2, figsize=(11.0, 3.8))
        chosen = [r for r in rows if r["query_set"] == query_set and r["epoch"] > 0]
        for group in dict.fromkeys(r["train_group"] for r in chosen):
            series = sorted((r["epoch"], r["bif"], r["stderr"]) for r in chosen if r["train_group"] == group)
            epochs = [s[0] for s in series]
            left.errorbar(epochs, [s[1] for s in series], yerr=[s[2] for s in series], marker="o", ms=3,
                          capsize=2, color=_GROUP_COLORS.get(group), label=f"{group} training examples")
        left.axhline(0.0, color="0.5", lw=0.8)
        left.set(xscale="log", xlabel="epoch",
                 ylabel=f"mean BIF on {query_set} loss\n(-Cov; negative = lowers it)")
        amp = sorted({(r["epoch"], r["amplification"]) for r in chosen})
        right.plot([a[0] for a in amp], [a[1] for a in amp], marker="o", ms=3, color="black",
                   label="minority / majority gradient norm")
        right.set(xscale="log", yscale="log", xlabel="epoch", ylabel="gradient amplification of the minority")
        for axis in (left, right):
            _shade_phases(axis, chosen, outcome)
            axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        if title:
            fig.suptitle(title)
    return fig


def _shade_phases(axis: Any, rows: Sequence[Mapping[str, Any]], outcome: Mapping[str, Any] | None) -> None:
    epochs = sorted({r["epoch"] for r in rows})
    if not epochs:
        return
    last = epochs[-1]
    if outcome is not None:
        shortcut, onset = outcome.get("shortcut_epoch"), outcome.get("phase2_onset_epoch")
        generalized = outcome.get("first_generalized_epoch")
    else:
        first = {p: min(r["epoch"] for r in rows if r["phase"] == p) for p in {r["phase"] for r in rows}}
        shortcut, onset, generalized = first.get("shortcut"), first.get("phase 2"), first.get("generalized")
    if shortcut is not None:
        axis.axvspan(max(shortcut, epochs[0]), onset or generalized or last, color="tab:orange", alpha=0.12, lw=0,
                     label="phase 1: shortcut")
    if onset is not None:
        axis.axvspan(onset, generalized or last, color="tab:green", alpha=0.15, lw=0, label="phase 2")
    if generalized is not None:
        axis.axvline(generalized, color="tab:green", ls="--", lw=1.0, label=f"generalized (epoch {generalized})")


def plot_influence_summary(runs: Mapping[str, Sequence[Mapping[str, Any]]], kinds: Mapping[str, str],
                           query_set: str = "adv", group: str = "anti") -> Any:
    """One panel across runs: a group's influence on a query set vs epoch, one line per run,
    coloured by the run's kind (``left the shortcut`` / anything else, e.g. ``no phase 2``), each
    line's first checkpoint in phase 2 marked."""
    from interp_toolkit.plotting import new_figure, style

    colors = {"left the shortcut": "tab:green"}
    with style():
        fig, axis = new_figure(figsize=(7.5, 4.0))
        seen = set()
        for name, rows in runs.items():
            series = sorted((r["epoch"], r["bif"]) for r in rows
                            if r["query_set"] == query_set and r["train_group"] == group and r["epoch"] > 0)
            kind = kinds.get(name, "no phase 2")
            axis.plot([s[0] for s in series], [s[1] for s in series], marker="o", ms=2.5, lw=1.2,
                      color=colors.get(kind, "tab:gray"), label=kind if kind not in seen else None)
            seen.add(kind)
            onset = [r["epoch"] for r in rows if r["phase"] == "phase 2"]
            if onset:
                value = dict(series).get(min(onset))
                if value is not None:
                    axis.plot([min(onset)], [value], marker="*", ms=10, color="tab:green", ls="none",
                              label="first checkpoint in phase 2" if "onset" not in seen else None)
                    seen.add("onset")
        axis.axhline(0.0, color="0.5", lw=0.8)
        axis.set(xscale="log", xlabel="epoch",
                 ylabel=f"mean BIF of {group} examples on {query_set} loss\n(-Cov; negative = lowers it)")
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    return fig


__all__ = ["plot_influence", "plot_influence_summary"]
