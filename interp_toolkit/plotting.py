"""One figure style for the toolkit: notebooks, papers and the files the CLI writes.

Every plot function of the toolkit follows the same contract:

* it returns a :class:`matplotlib.figure.Figure`;
* it takes an optional ``ax`` (or a sequence of axes for multi-panel figures) to draw into
  a figure of yours, e.g. one panel of a paper figure;
* it never calls ``matplotlib.use`` and never touches pyplot's state: figures are built
  with :class:`matplotlib.figure.Figure` directly, so an inline notebook backend keeps
  working, nothing is left open, and scripts need no display. In a notebook a returned
  figure shows when it is the cell's value (or with ``display(fig)``): new figures come
  from :func:`figure`, whose figures render themselves for IPython under any backend.

Files are written with :func:`save_figure` (atomic, ``png``, ``svg`` or ``pdf``).

Colours: :func:`component_colors` gives one colour per head or component, assigned in
(layer, head) order over every component a figure shows, so the same head has the same
colour in every panel of it. :func:`label` turns column names into axis labels; :func:`epoch_axis`
log-scales an epoch axis (symmetric-log, so epoch 0 stays visible) where early
checkpoints matter.

Conventions every figure follows (and tests check):

* colour names a component (head, layer, group), line style names a data split
  (:data:`SPLIT_LINESTYLES`: adversarial solid, validation dashed, training dotted), so
  val and adv never differ by colour alone;
* legends sit outside the data (:func:`legend_outside`);
* nothing in the data is dropped silently: a line drawn for a table's series is tagged
  with :func:`tag_series` (read back with :func:`drawn_series`), and whatever a figure
  must leave out is named in it by :func:`note_not_shown`;
* axis labels name the metric (:func:`label`, or the analysis's own label).
"""

from __future__ import annotations

import io
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, cast

from interp_toolkit.errors import UserError

FORMATS = ("png", "svg", "pdf")

#: rcParams of every toolkit figure (applied while drawing, see :func:`style`).
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.4,
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "svg.fonttype": "none",  # editable text in SVG
    "pdf.fonttype": 42,  # TrueType in PDF (journals reject Type 3)
}

# Okabe-Ito: distinguishable with the common colour-vision deficiencies, prints in grey.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

#: Colours of components, in order: Okabe-Ito without black (black is the whole model in
#: every figure), then tab10 colours none of those resembles; pale yellow and cyan (near sky
#: blue) come last.
COMPONENT_PALETTE = PALETTE[:6] + ["#8C564B", "#9467BD", "#7F7F7F", "#BCBD22", "#D62728", PALETTE[6], "#17BECF"]

#: Human names of the columns and split names the toolkit writes.
LABELS: dict[str, str] = {
    "epoch": "epoch",
    "train": "training",
    "val": "validation",
    "adv": "adversarial",
    "acc": "accuracy",
    "loss": "cross-entropy loss",
    "logit_diff": "logit difference",
    "accuracy": "accuracy",
    "r": "spurious ratio r",
    "rate": "generalization rate",
    "grad_cosine": "gradient cosine",
    "cosine": "cosine similarity",
    "spearman": "Spearman correlation",
    "qk_spearman": "QK Spearman correlation",
    "ov_spearman": "OV Spearman correlation",
    "recovered": "fraction recovered",
    "fraction_recovered": "fraction of the gap recovered",
    "delta_loss": "loss change",
    "delta_acc": "accuracy change",
    "ablated_acc": "accuracy after ablation",
    "ablated_loss": "loss after ablation",
    "bif": "BIF",
    "induction_score": "induction score",
    # analyses' value columns
    "qk_rho": "QK fingerprint (Spearman ρ)",
    "ov_rho": "OV fingerprint (Spearman ρ)",
    "ov_data_rho": "OV on data (Spearman ρ)",
    "ov_label_rho": "OV vs label (Spearman ρ)",
    "first_share": "attention share on position 0",
    "delta": "accuracy change when ablated",
    "normalized": "patching effect (0 none, 1 full)",
    "conflict_cos": "cos(consistent, anti) gradient",
    "amplification": "anti / consistent gradient norm",
    "minority_amplification": "minority / majority gradient norm",
    "anti_cos_mean": "anti examples: mean cos to consistent",
    "norm": "parameter L2 norm",
}


def _figure_class() -> type:
    from matplotlib.figure import Figure

    class NotebookFigure(Figure):
        """A plain Figure that also shows itself in Jupyter without pyplot.

        Figures built without pyplot are invisible to the inline backend's display hook;
        ``_repr_png_`` lets IPython render one that is a cell's value (or passed to
        ``display``) under any backend.
        """

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            with style():
                self.savefig(buffer, format="png", dpi=STYLE["figure.dpi"])
            return buffer.getvalue()

    return NotebookFigure


_FIGURE_CLASS: type | None = None


def figure(**kwargs: Any) -> Any:
    """A new :class:`matplotlib.figure.Figure` (no pyplot) that displays itself in notebooks."""
    global _FIGURE_CLASS
    if _FIGURE_CLASS is None:
        _FIGURE_CLASS = _figure_class()
    return _FIGURE_CLASS(**kwargs)


@contextmanager
def style() -> Iterator[None]:
    """Apply :data:`STYLE` while drawing (restores the caller's rcParams afterwards)."""
    import matplotlib

    with matplotlib.rc_context(cast(Any, STYLE)):  # its stubs want literal rcParams keys
        yield


def new_figure(ax: Any = None, figsize: tuple[float, float] = (6.0, 4.0)) -> tuple[Any, Any]:
    """``(figure, axes)``: the figure of ``ax`` if given, else a new one-panel figure.

    The new figure is a bare :class:`matplotlib.figure.Figure` (no pyplot, no backend
    switch); call inside :func:`style` so it gets the toolkit's look.
    """
    if ax is not None:
        return ax.figure, ax
    fig = figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def new_panels(n: int, ax: Sequence[Any] | None = None, ncols: int = 1,
               figsize: tuple[float, float] | None = None, sharex: bool = False) -> tuple[Any, list[Any]]:
    """``(figure, axes)`` for an ``n``-panel plot: the caller's ``n`` axes, or a new figure.

    Raises:
        ValueError: If ``ax`` is given with a number of axes other than ``n``.
    """
    if ax is not None:
        # one Axes, a list of them, or a numpy array from plt.subplots (any shape)
        axes: list[Any] = [ax] if hasattr(ax, "figure") else list(getattr(ax, "flat", ax))
        if len(axes) != n:
            raise UserError(f"this plot draws {n} panels; pass {n} axes as ax, got {len(axes)}")
        return axes[0].figure, axes
    nrows = -(-n // ncols)
    fig = figure(figsize=figsize or (5.0 * ncols, 3.4 * nrows), layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    axes = list(grid.flat)
    for extra in axes[n:]:
        extra.set_visible(False)
    return fig, axes[:n]


def check_format(fmt: str) -> str:
    """``fmt`` lower-cased if it is one of :data:`FORMATS`; a ``UserError`` naming it otherwise."""
    if not isinstance(fmt, str) or fmt.lower() not in FORMATS:
        raise UserError(f"figure format must be one of {list(FORMATS)}, got {fmt!r}")
    return fmt.lower()


#: The longest side of a saved raster figure, in pixels (:func:`save_figure`).
MAX_PIXELS = 2000


def save_figure(fig: Any, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``fig`` atomically; returns the path written.

    Args:
        fig: A matplotlib figure.
        path: Destination. Its suffix is replaced by the format's when ``fmt`` is given.
        fmt: ``png``, ``svg`` or ``pdf`` (default: the path's suffix, else ``png``). A png
            is at most :data:`MAX_PIXELS` on its longer side (its dpi lowered if needed).
    """
    from interp_toolkit.io import atomic_write_bytes

    path = Path(path)
    if fmt is None:
        fmt = path.suffix[1:] if path.suffix[1:].lower() in FORMATS else "png"
    fmt = check_format(fmt)
    path = path.with_suffix(f".{fmt}")
    buffer = io.BytesIO()
    with style():
        # a raster figure keeps the style's dpi up to MAX_PIXELS on its longer side: a grid of
        # many panels is drawn smaller, never as an image no screen shows whole
        dpi = min(float(STYLE["savefig.dpi"]), MAX_PIXELS / float(max(fig.get_size_inches())))
        fig.savefig(buffer, format=fmt, dpi=dpi)
        if fmt == "png":  # a tight bounding box can add what sits outside the axes: measured, then fixed
            width, height = (int.from_bytes(buffer.getvalue()[16:20], "big"),
                             int.from_bytes(buffer.getvalue()[20:24], "big"))
            if max(width, height) > MAX_PIXELS:
                buffer = io.BytesIO()
                fig.savefig(buffer, format=fmt, dpi=dpi * MAX_PIXELS / max(width, height) * 0.995)
    return atomic_write_bytes(path, buffer.getvalue())


def label(name: str) -> str:
    """Human axis label of a column name: ``"adv_acc"`` -> ``"adversarial accuracy"``.

    Known names come from :data:`LABELS`; ``<split>_<quantity>`` is spelled out part by
    part; component names (``L0H1``, ``blocks.0.attn``) and unknown names are returned
    with underscores as spaces.
    """
    if name in LABELS:
        return LABELS[name]
    parts = name.split("_")
    if len(parts) >= 2 and parts[0] in LABELS and "_".join(parts[1:]) in LABELS:
        return f"{LABELS[parts[0]]} {LABELS['_'.join(parts[1:])]}"
    return name.replace("_", " ")


_HEAD = re.compile(r"L(\d+)H(\d+)")
_LAYER = re.compile(r"(?:blocks\.|L)(\d+)")


def _component_order(name: str) -> tuple[int, int, str]:
    head = _HEAD.search(name)
    if head:
        return int(head.group(1)), int(head.group(2)), name
    layer = _LAYER.search(name)
    return (int(layer.group(1)) if layer else 10**6), 10**6, name


def component_colors(names: Iterable[str]) -> dict[str, str]:
    """One colour per component, the same in every panel that shows that component.

    Colours are assigned in (layer, head) order of the names given, so pass every
    component a figure shows (all its panels together), and the same head gets the same
    colour throughout: :data:`COMPONENT_PALETTE` (never black, the whole model's colour),
    then the light half of ``tab20``: 23 distinct colours before any repeats.
    """
    import matplotlib

    ordered = sorted(set(names), key=_component_order)
    tab20 = matplotlib.colormaps["tab20"]  # a listed map: colour i of its list is tab20(i)
    light = [matplotlib.colors.to_hex(tab20(i)) for i in range(1, tab20.N, 2)]  # its light halves
    colors = COMPONENT_PALETTE + light
    return {name: colors[i % len(colors)] for i, name in enumerate(ordered)}


#: What each MPSP evaluation split is with respect to the shortcut (legend suffixes).
MPSP_SPLIT_ROLES = {"val": "shortcut-consistent", "adv": "anti-shortcut"}


def mpsp_split_label(split: str) -> str:
    """Legend label of an MPSP split: ``"adv"`` -> ``"adversarial (anti-shortcut)"``."""
    role = MPSP_SPLIT_ROLES.get(split)
    return label(split) + (f" ({role})" if role else "")


#: Line style of each data split: a split is told apart by style, so colour stays free
#: for the component (adversarial, the headline split, solid).
SPLIT_LINESTYLES: dict[str, str] = {"adv": "-", "val": "--", "train": ":"}

#: Start of the figure text naming what a figure leaves out (:func:`note_not_shown`).
NOT_SHOWN = "not shown: "

_SERIES_GID = "series:"


def split_linestyle(split: str) -> str:
    """Line style of a split (:data:`SPLIT_LINESTYLES`; solid for any other name)."""
    return SPLIT_LINESTYLES.get(split, "-")


def legend_outside(ax: Any, **kwargs: Any) -> Any:
    """A legend to the right of ``ax``, outside the data (None when nothing is labelled).

    Keyword arguments go to :meth:`matplotlib.axes.Axes.legend` (e.g. ``handles``,
    ``ncol``, ``title``).
    """
    if "handles" not in kwargs and not ax.get_legend_handles_labels()[0]:
        return None
    kwargs.setdefault("fontsize", "small")
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def tag_series(artist: Any, key: str) -> Any:
    """Mark ``artist`` as the drawing of the table series ``key`` (see :func:`drawn_series`)."""
    artist.set_gid(_SERIES_GID + key)
    return artist


def drawn_series(fig: Any) -> list[str]:
    """Keys of the table series drawn in ``fig`` (lines tagged with :func:`tag_series`)."""
    keys = []
    for ax in fig.axes:
        for line in ax.get_lines():
            gid = line.get_gid()
            if isinstance(gid, str) and gid.startswith(_SERIES_GID):
                keys.append(gid[len(_SERIES_GID):])
    return keys


def not_shown_notes(fig: Any) -> list[str]:
    """Lines of ``fig``'s note of what it leaves out (written by :func:`note_not_shown`),
    one per reason."""
    notes: list[str] = []
    for text in fig.texts:
        if text.get_text().startswith(NOT_SHOWN):
            notes += [line for line in text.get_text().replace("\n" + NOT_SHOWN, "\x00" + NOT_SHOWN).split("\x00")]
    return notes


def note_not_shown(fig: Any, items: Sequence[str], why: str) -> Any:
    """Name, in the figure, what it leaves out: ``"not shown: <why>: a, b, ..."``.

    Args:
        fig: The figure.
        items: What is left out (series names); nothing is written when empty.
        why: The reason (e.g. ``"blank at every checkpoint"``).

    Returns:
        The text artist, or None when ``items`` is empty.
    """
    if not items:
        return None
    import textwrap

    listed = ", ".join(items[:40]) + (f" and {len(items) - 40} more" if len(items) > 40 else "")
    text = textwrap.fill(f"{NOT_SHOWN}{len(items)} series, {why}: {listed}", 120)
    for existing in fig.texts:  # one note block below the figure, however many reasons
        if existing.get_text().startswith(NOT_SHOWN):
            existing.set_text(existing.get_text() + "\n" + text)
            return existing
    return fig.text(0.01, 0.0, text, ha="left", va="top", fontsize="small", color="#444444")


def component_kind(name: str) -> str:
    """The kind of a component or parameter group name, for one panel per kind:
    ``"head"`` (``L0H1``, ``L0H1.QK``), ``"mlp"``, ``"attn"``, ``"embed"``, else ``"model"``."""
    lowered = name.lower()
    if _HEAD.search(name):
        return "head"
    for kind in ("mlp", "attn", "embed"):
        if kind in lowered:
            return kind
    return "model"


def split_colors() -> dict[str, str]:
    """Fixed colours of the data splits (training, validation, adversarial)."""
    return {"train": PALETTE[0], "val": PALETTE[2], "adv": PALETTE[3]}


def plot_accuracies(ax: Any, metrics: Sequence[Mapping[str, Any]]) -> list[float]:
    """Every split's accuracy of a run's evaluations (``metrics.jsonl`` lines) on ``ax``, one
    line per split in its colour and line style, the y axis from 0 to 1; returns the epochs
    drawn (for the caller's epoch axis)."""
    epochs: list[float] = []
    for key in sorted({k for m in metrics for k in m if k.endswith("_acc")}):
        split = key[:-4]
        xs = [m["epoch"] for m in metrics if key in m]
        epochs += xs
        ax.plot(xs, [m[key] for m in metrics if key in m], label=label(split), color=split_colors().get(split),
                ls=split_linestyle(split))
    ax.set(ylabel="accuracy", ylim=(-0.02, 1.02))
    return epochs


def epoch_axis(ax: Any, epochs: Sequence[float] | None = None) -> None:
    """Log-scale an epoch x axis, keeping epoch 0 visible (symmetric log, linear below 1).

    Early checkpoints (1, 2, 4, ...) are where most changes happen; a linear axis squeezes
    them into the first pixel. Falls back to linear when every epoch is below 10.
    """
    if epochs is not None and len(epochs) and max(epochs) < 10:
        ax.set_xlabel("epoch")
        return
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.4)
    ax.set_xlim(left=0)
    ax.set_xlabel("epoch (log scale)")


__all__ = [
    "COMPONENT_PALETTE", "FORMATS", "LABELS", "MAX_PIXELS", "MPSP_SPLIT_ROLES", "NOT_SHOWN", "PALETTE",
    "SPLIT_LINESTYLES", "STYLE", "check_format", "component_colors", "component_kind", "drawn_series", "epoch_axis",
    "figure", "label", "legend_outside", "mpsp_split_label", "new_figure", "new_panels", "not_shown_notes",
    "note_not_shown", "plot_accuracies", "save_figure", "split_colors", "split_linestyle", "style", "tag_series",
]
