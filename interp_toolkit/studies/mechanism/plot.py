"""The mechanism figure of one run (:func:`plot_mechanism`), and the figure saved with its data
(:func:`write_mechanism`: figure, tidy CSV and JSON side by side): seven panels on one log-scaled
epoch axis, one colour per head, drawn from a
:class:`~interp_toolkit.studies.mechanism.measure.MechanismResult` alone (computed, or read back from
its CSV by :func:`~interp_toolkit.studies.mechanism.measure.read_mechanism`); the panels are listed
in :mod:`interp_toolkit.studies.mechanism.measure`'s docstring."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.runs.layout import ANALYSES
from interp_toolkit.studies.mechanism.measure import (
    ALL,
    PANEL_QUANTITIES,
    MechanismResult,
    analysis_dir,
    minority_of,
)


def _title(result: MechanismResult) -> str:
    task, model = result.task, result.model
    arch = f"{model.get('n_layers', '?')}L{model.get('n_heads', '?')}H"
    from interp_toolkit.tasks.custom import describe_task

    parts = [f"{arch}, {describe_task(task)}"]  # the task's own recorded settings, whatever its keys
    verdict = ("generalized at epoch {}".format(result.outcome["first_generalized_epoch"])
               if result.outcome.get("generalized") else "not generalized")
    parts.append(f"{result.run_dir.name}: {verdict} (last epoch {result.outcome.get('final_epoch')})")
    if not result.outcome.get("generalized") and result.near_miss.get("text"):
        import textwrap

        parts.append(textwrap.fill(result.near_miss["text"], 110))
    return "\n".join(parts)


#: Panels of the mechanism figure in drawing order (``fig.axes`` order), laid out in two
#: columns: accuracy | gradient cosine, amplification | ablation, QK | OV fingerprint,
#: patching | the key (head colours, phase markers).
PANEL_ORDER = ("accuracy", "gradient cosine", "amplification", "ablation", "QK fingerprint", "OV fingerprint",
               "minimal-pair patching")


def _symlog_ticks(panel: Any, linthresh: float, values: Sequence[float]) -> None:
    """Ticks at 0 and at powers of ten from ``linthresh`` outward, at most five per side, so
    labels never crowd around the linear region (matplotlib's default put ticks 1 px apart)."""
    import matplotlib.ticker as ticker

    low = math.floor(math.log10(linthresh))
    top = max((abs(v) for v in values), default=linthresh)
    high = max(low, math.ceil(math.log10(top)))
    step = max(1, math.ceil((high - low + 1) / 5))
    powers = [10.0 ** e for e in range(low, high + 1, step)]
    ticks = sorted({0.0, *powers, *[-p for p in powers if any(v < -p / 2 for v in values)]})
    panel.yaxis.set_major_locator(ticker.FixedLocator(ticks))
    panel.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: "0" if v == 0 else f"{v:g}"))
    panel.yaxis.set_minor_locator(ticker.NullLocator())


def plot_mechanism(result: MechanismResult, ax: Sequence[Any] | None = None) -> Any:
    """The seven-panel mechanism figure of :func:`mechanism_over_checkpoints` (module docstring).

    Drawn from ``result.table`` and ``result.outcome`` only, in two columns (about 11 x 12
    inches, readable when printed at page width): one colour per head in every panel (black:
    the whole model), named once in the key beside the patching panel; line style for the
    split (:data:`interp_toolkit.plotting.SPLIT_LINESTYLES`) or the measured part (QK solid,
    OV dashed ...), explained by a small legend above each panel; phase markers (vertical
    lines) in every panel, and a log-scaled epoch axis shared by all panels. The title
    (``fig.get_suptitle()``) names the run, its outcome and a near miss.

    Args:
        result: What :func:`mechanism_over_checkpoints` returned.
        ax: Optional sequence of 7 axes to draw into (e.g. panels of a larger figure), in
            :data:`PANEL_ORDER`; the key is then the accuracy panel's legend.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from matplotlib.lines import Line2D

    from interp_toolkit.plotting import (
        component_colors,
        epoch_axis,
        figure,
        mpsp_split_label,
        new_panels,
        split_colors,
        split_linestyle,
        style,
    )

    heads = result.heads
    colors = component_colors(heads)
    epochs_seen = sorted({r["epoch"] for r in result.table.rows})
    markers = [(result.outcome.get("shortcut_epoch"), "--", "shortcut learned"),
               (result.outcome.get("phase2_onset_epoch"), ":", "phase 2 onset"),
               (result.outcome.get("first_generalized_epoch"), "-.", "generalized")]

    def per_head(panel: Any, quantity: str, suffix: str, ls: str = "-") -> None:
        for head in heads:
            xs, ys = result.series(quantity, head)
            if xs:
                panel.plot(xs, ys, color=colors[head], ls=ls, marker=".", markersize=3, label=f"{head} {suffix}")

    def whole(panel: Any, quantity: str, text: str, ls: str = "-") -> None:
        xs, ys = result.series(quantity)
        if xs:
            panel.plot(xs, ys, color="black", lw=2.0, ls=ls, label=text)

    def style_key(panel: Any, entries: Sequence[tuple[str, str, float]]) -> None:
        # what each line style means in this panel, above the data (colours are in the key)
        handles = [Line2D([], [], color="black", ls=ls, lw=lw, label=text) for text, ls, lw in entries]
        panel.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=len(handles),
                     frameon=False, borderaxespad=0.2, handlelength=2.2, columnspacing=1.2)

    with style():
        if ax is None:
            fig = figure(figsize=(11.0, 12.0), layout="constrained")
            grid = fig.subplots(4, 2, sharex=True)
            axes = [grid[0][0], grid[0][1], grid[1][0], grid[1][1], grid[2][0], grid[2][1], grid[3][0]]
            key_slot = grid[3][1]  # last in fig.axes: the seven panels come first, in PANEL_ORDER
            key_slot.set_axis_off()
            grid[2][1].xaxis.set_tick_params(labelbottom=True)  # the key below it has no epoch axis
        else:
            fig, axes = new_panels(7, ax)
            key_slot = None
        acc, cos, amp, abl, qk, ov, patch = axes
        for split, color in split_colors().items():
            xs, ys = result.series(f"acc_{split}")
            acc.plot(xs, ys, color=color, ls=split_linestyle(split), label=mpsp_split_label(split))
        acc.set(ylabel="accuracy", ylim=(-0.02, 1.02))
        acc.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, borderaxespad=0.2)
        fig.suptitle(_title(result), fontsize="medium")

        whole(cos, "grad_cos", "all parameters")
        per_head(cos, "grad_cos_qk", "QK")
        per_head(cos, "grad_cos_ov", "OV", "--")
        cos.axhline(0, color="grey", lw=0.6)
        cos.set(ylabel="gradient cosine\n(consistent vs anti mean)", ylim=(-1.05, 1.05))
        style_key(cos, [("all parameters", "-", 2.0), ("head QK", "-", 1.2), ("head OV", "--", 1.2)])

        # the paper's amplification of the minority; anti / consistent where there is no minority
        # (r = 0.5) or the table predates the minority quantities
        minority = minority_of(float(result.task.get("r", 0.5)))
        prefix = "minority_" if minority != "none" and result.series("minority_amplification")[0] else ""
        whole(amp, f"{prefix}amplification", "all parameters")
        per_head(amp, f"{prefix}amplification_qk", "QK")
        per_head(amp, f"{prefix}amplification_ov", "OV", "--")
        amp.axhline(1, color="grey", lw=0.6)
        ratio = "anti / consistent" if minority == "anti" else "consistent / anti"
        amp.set(ylabel=(f"minority amplification\n({ratio} grad norm)" if prefix
                        else "amplification\n(anti / consistent grad norm)"), yscale="log")
        style_key(amp, [("all parameters", "-", 2.0), ("head QK", "-", 1.2), ("head OV", "--", 1.2)])

        per_head(abl, "ablation_acc_adv", "adv", split_linestyle("adv"))
        per_head(abl, "ablation_acc_val", "val", split_linestyle("val"))
        abl.axhline(0, color="grey", lw=0.6)
        abl.set(ylabel=f"{result.config.ablation_method} ablation of a head:\naccuracy change", ylim=(-1.05, 1.05))
        style_key(abl, [(mpsp_split_label("adv"), split_linestyle("adv"), 1.2),
                        (mpsp_split_label("val"), split_linestyle("val"), 1.2)])

        per_head(qk, "qk_rho", "QK ρ")
        per_head(qk, "first_share", "attention on pos 0", ":")
        qk.axhline(0, color="grey", lw=0.6)
        qk.set(ylabel="QK magnitude fingerprint\n(ρ score vs value) / pos-0 share", ylim=(-1.05, 1.05))
        style_key(qk, [("QK ρ", "-", 1.2), ("attention share on position 0", ":", 1.2)])

        per_head(ov, "ov_rho", "OV ρ (weights)")
        per_head(ov, "ov_data_rho", "OV ρ (data)", "--")
        ov.axhline(0, color="grey", lw=0.6)
        ov.set(ylabel="OV parity fingerprint\n(ρ vs value mod m)", ylim=(-1.05, 1.05))
        style_key(ov, [("from the weights", "-", 1.2), ("on data", "--", 1.2)])

        whole(patch, "patch_gap_val_to_adv", "full gap val→adv")
        whole(patch, "patch_gap_adv_to_val", "full gap adv→val", "--")
        per_head(patch, "patch_val_to_adv", "val→adv")
        per_head(patch, "patch_adv_to_val", "adv→val", "--")
        patch.axhline(0, color="grey", lw=0.6)
        present = {row["quantity"] for row in result.table.rows}
        if not any(q in present for q in PANEL_QUANTITIES["minimal-pair patching"]):
            patch.text(0.5, 0.5, "not measured: the task's splits\ngive no minimal pairs", ha="center",
                       va="center", transform=patch.transAxes, color="grey")
        patch.set(ylabel="minimal-pair patching:\nΔ logit diff (source − target label)")
        style_key(patch, [("full gap", "-", 2.0), ("head, val→adv", "-", 1.2), ("head, adv→val", "--", 1.2)])
        # The gap grows by orders of magnitude when the rule is learned; a symmetric-log axis
        # keeps the early, small effects readable beside it.
        patch_values = [v for q in PANEL_QUANTITIES["minimal-pair patching"] if "normalized" not in q
                        for h in [ALL, *heads] for v in result.series(q, h)[1]]
        if patch_values and max(abs(v) for v in patch_values) > 0:
            linthresh = max(max(abs(v) for v in patch_values) / 100, 1e-4)
            patch.set_yscale("symlog", linthresh=linthresh, linscale=0.6)
            _symlog_ticks(patch, linthresh, patch_values)

        for panel in axes:
            for epoch, ls, text in markers:
                if epoch is not None:
                    panel.axvline(epoch, color="grey", ls=ls, lw=1.0,
                                  label=f"{text} (epoch {epoch})" if panel is acc else None)
            epoch_axis(panel, epochs_seen)
        for panel in axes[:-2]:  # the last row (patching, and the key or the ablation) keeps its epoch label
            panel.set_xlabel("")
        key = [Line2D([], [], color=colors[head], lw=2.0, label=head) for head in heads]
        key.append(Line2D([], [], color="black", lw=2.0, label="whole model"))
        key += [Line2D([], [], color="grey", ls=ls, lw=1.0, label=f"{text} (epoch {epoch})")
                for epoch, ls, text in markers if epoch is not None]
        if key_slot is not None:
            key_slot.legend(handles=key, loc="center", title="colour: head; grey: phase markers",
                            ncol=2 if len(key) > 10 else 1, fontsize="medium")
        else:
            acc.legend(handles=acc.get_legend_handles_labels()[0] + key, loc="upper left",
                       bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")
    return fig



def write_mechanism(result: MechanismResult, path: str | Path, fmt: str | None = None) -> dict[str, Path]:
    """Save the figure, its tidy table (``.csv``) and settings + outcome (``.json``) side by side.

    Args:
        result: What :func:`mechanism_over_checkpoints` returned.
        path: The figure's path; the CSV and JSON get the same stem.
        fmt: ``png``, ``svg`` or ``pdf`` (default: the path's suffix, else ``png``).

    Files are written atomically. When the three files at ``path`` are the ones written
    before for a result of the same :attr:`MechanismResult.cache_key` (their digests are
    recorded in the run's ``analyses/mechanism/written.json``), nothing is drawn or written
    again: a cached rerun costs what reading the cache costs.

    Returns:
        ``{"figure": ..., "table": ..., "summary": ...}`` paths of the three files.
    """
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.plotting import check_format

    path = Path(path)
    fmt = check_format(fmt if fmt is not None else (path.suffix[1:] if path.suffix[1:].lower() in FIGURE_SUFFIXES
                                                     else "png"))
    figure_path = path.with_suffix(f".{fmt}")
    paths = {"figure": figure_path, "table": figure_path.with_suffix(".csv"),
             "summary": figure_path.with_suffix(".json")}
    written = _written_files(result, paths)
    if written is not None and all(paths[name].is_file() and _digest(paths[name]) == d
                                   for name, d in written.items()):
        return paths  # these files are this result's, as written before: drawing again changes nothing
    from interp_toolkit.plotting import save_figure

    save_figure(plot_mechanism(result), figure_path, fmt)
    result.to_csv(paths["table"])
    atomic_write_json(paths["summary"], result.summary())
    _record_written_files(result, paths)
    return paths


FIGURE_SUFFIXES = ("png", "svg", "pdf")
_WRITTEN = "written.json"


def _digest(path: Path) -> str:
    from interp_toolkit.io import file_digest

    return file_digest(path)


def _written_files(result: MechanismResult, paths: dict[str, Path]) -> dict[str, str] | None:
    """Digests of the files :func:`write_mechanism` last wrote at ``paths`` for a result with
    this ``cache_key`` (None when unknown)."""
    import json

    if result.cache_key is None:
        return None
    record = analysis_dir(result.run_dir, _WRITTEN)
    try:
        entries = json.loads(record.read_text(encoding="utf-8"))
        entry = entries[str(paths["figure"].resolve())]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entry["digests"] if isinstance(entry, dict) and entry.get("key") == result.cache_key else None


def _record_written_files(result: MechanismResult, paths: dict[str, Path]) -> None:
    import json

    from interp_toolkit.io import atomic_write_json

    if result.cache_key is None or not (result.run_dir / ANALYSES).is_dir():
        return
    record = analysis_dir(result.run_dir, _WRITTEN)
    try:
        entries = json.loads(record.read_text(encoding="utf-8"))
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[str(paths["figure"].resolve())] = {"key": result.cache_key,
                                               "digests": {name: _digest(p) for name, p in paths.items()}}
    atomic_write_json(record, entries)


__all__ = ["FIGURE_SUFFIXES", "PANEL_ORDER", "plot_mechanism", "write_mechanism"]
