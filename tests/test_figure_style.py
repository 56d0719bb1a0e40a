"""The figure conventions of interp_toolkit.plotting, checked on the figures themselves:
nothing in a table is dropped silently, legends sit outside the data, split is line style
and component is colour, axis labels name the metric."""

from __future__ import annotations

import math

import pytest
from matplotlib.figure import Figure

from interp_toolkit.analyses._common import Table
from interp_toolkit.analyses.over_checkpoints import (
    ANALYSES,
    MAX_PANELS,
    over_checkpoints_panel_count,
    plot_over_checkpoints,
    plotted_series,
)
from interp_toolkit.errors import UserError
from interp_toolkit.io import append_jsonl
from interp_toolkit.plotting import (
    NOT_SHOWN,
    drawn_series,
    legend_outside,
    not_shown_notes,
    split_linestyle,
)

EPOCHS = (0, 1, 2, 4, 8, 16)


def _metrics(run_dir):
    for epoch in EPOCHS:
        append_jsonl(run_dir / "metrics.jsonl", {"epoch": epoch, "train_acc": 0.6, "val_acc": 0.9, "adv_acc": 0.1})


def _patching_rows(components, positions):
    return [{"epoch": e, "component": c, "kind": kind, "position": p, "normalized": 0.1 * i + e / 100}
            for e in EPOCHS for i, (c, kind) in enumerate(components) for p in positions]


def _csv_series(table, spec, tmp_path):
    """Series of the table as its CSV reads back: what a reader of the CSV would expect drawn."""
    back = Table.from_csv(table.to_csv(tmp_path / "table.csv"))
    return {f"{column}:{key}" for column in spec.value_columns for key in plotted_series(back, spec, column)}


def _legends_outside(fig):
    fig.draw_without_rendering()
    checked = 0
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box, frame = legend.get_window_extent(), ax.get_window_extent()
        assert box.x0 >= frame.x1 - 1 or box.y0 >= frame.y1 - 1, f"legend of {ax.get_title()!r} overlaps its axes"
        for other in fig.axes:  # nor does it cover another panel
            if other is not ax:
                assert not box.overlaps(other.get_window_extent()), f"a legend covers {other.get_title()!r}"
        checked += 1
    return checked


COMPONENTS = [(f"L{layer}H{head}", "head") for layer in range(2) for head in range(4)] + [
    ("attn0", "attn"), ("attn1", "attn"), ("mlp0", "mlp"), ("mlp1", "mlp")]


def _lines(name: str):
    """The analysis drawn as lines of ``normalized`` (patching's default is heatmaps): the line
    renderer's rules are tested on its many series."""
    import dataclasses

    return dataclasses.replace(ANALYSES[name], heatmaps=False, value_columns=("normalized",))


def test_every_csv_series_is_drawn_beyond_sixteen_lines(tmp_path):
    # 12 components x 3 positions = 36 series: the old figure drew 16 and dropped attn and mlp
    _metrics(tmp_path)
    spec = _lines("patching")
    table = Table(_patching_rows(COMPONENTS, positions=(0, 2, 4)))
    fig = plot_over_checkpoints(table, tmp_path, spec)
    drawn = drawn_series(fig)
    assert len(drawn) == len(set(drawn)) == 36
    assert set(drawn) == _csv_series(table, spec, tmp_path)
    assert not not_shown_notes(fig)
    # one panel per kind and position (heads, attn, mlp at 3 positions) + accuracy
    assert len(fig.axes) == over_checkpoints_panel_count(table, spec) == 1 + 3 * 3
    # each panel shows other series (its kind at its position): each has its legend, none covering a panel
    assert _legends_outside(fig) == len(fig.axes)
    for ax in fig.axes[1:]:
        colors = [line.get_color() for line in ax.get_lines() if (line.get_gid() or "").startswith("series:")]
        assert len(colors) == len(set(colors)), f"colours repeat in panel {ax.get_title()!r}"


def test_left_out_series_are_named_in_the_figure(tmp_path):
    _metrics(tmp_path)
    spec = _lines("patching")
    nan = float("nan")
    rows = _patching_rows(COMPONENTS[:2], positions=(-1,))
    rows += [{"epoch": e, "component": "L1H0", "kind": "head", "position": -1, "normalized": nan} for e in EPOCHS]
    table = Table(rows)
    fig = plot_over_checkpoints(table, tmp_path, spec)
    assert set(drawn_series(fig)) == {"normalized:L0H0 -1", "normalized:L0H1 -1"}
    (note,) = not_shown_notes(fig)
    assert note.startswith(NOT_SHOWN) and "normalized:L1H0 -1" in note and "blank" in note
    # drawn + named = every series of the CSV
    assert set(drawn_series(fig)) | {"normalized:L1H0 -1"} == _csv_series(table, spec, tmp_path)


def test_panels_beyond_the_cap_are_named_not_dropped(tmp_path):
    _metrics(tmp_path)
    spec = _lines("patching")
    positions = tuple(range(MAX_PANELS + 3))  # one head panel per position: 3 panels too many
    table = Table(_patching_rows(COMPONENTS[:1], positions))
    fig = plot_over_checkpoints(table, tmp_path, spec)
    drawn = set(drawn_series(fig))
    assert len(drawn) == MAX_PANELS
    (note,) = not_shown_notes(fig)
    left = {f"normalized:L0H0 {p}" for p in positions} - drawn
    assert len(left) == 3 and all(name in note for name in left)


def test_split_is_line_style_component_is_colour(tmp_path):
    _metrics(tmp_path)
    spec = ANALYSES["ablation"]
    table = Table([{"epoch": e, "component": c, "kind": "head", "split": split, "metric": "accuracy",
                    "delta": -0.1 * i} for e in EPOCHS for i, c in enumerate(("L0H0", "L0H1"))
                   for split in ("val", "adv")])
    fig = plot_over_checkpoints(table, tmp_path, spec)
    lines = {line.get_gid().split(":", 1)[1]: line for line in fig.axes[1].get_lines() if line.get_gid()}
    assert lines["delta:L0H0 val"].get_color() == lines["delta:L0H0 adv"].get_color()
    assert lines["delta:L0H0 val"].get_color() != lines["delta:L0H1 val"].get_color()
    assert lines["delta:L0H0 val"].get_linestyle() == split_linestyle("val") != split_linestyle("adv")
    assert lines["delta:L0H0 adv"].get_linestyle() == split_linestyle("adv")
    top = {line.get_label(): line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert top["validation"] != top["adversarial"]  # the accuracy panel too


def test_axis_labels_name_the_metric(tmp_path):
    _metrics(tmp_path)
    table = Table(_patching_rows(COMPONENTS[:2], positions=(-1,)))
    resample = plot_over_checkpoints(table, tmp_path, _lines("resample_ablation_damage")).axes[1].get_ylabel()
    patching = plot_over_checkpoints(table, tmp_path, _lines("patching")).axes[1].get_ylabel()
    assert "resample-ablation damage" in resample and "patching" not in resample
    assert "minimal-pair patching" in patching


def test_weight_norms_show_relative_change(tmp_path):
    _metrics(tmp_path)
    table = Table([{"epoch": e, "group": g, "norm": base * (1 + e / 100), "n_params": 4}
                   for e in EPOCHS for g, base in (("all", 40.0), ("L0H0.QK", 3.0), ("other", 0.0))])
    fig = plot_over_checkpoints(table, tmp_path, ANALYSES["weight_norms"])
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines() if line.get_gid()}
    for gid in ("series:norm:all", "series:norm:L0H0.QK"):
        ys = list(lines[gid].get_ydata())
        assert ys[0] == 1.0 and math.isclose(ys[-1], 1.16)
    assert "first checkpoint" in fig.axes[1].get_ylabel()
    (note,) = not_shown_notes(fig)
    assert "norm:other" in note  # 0 at the start: no relative change, named instead of dropped


def test_legend_outside_places_the_legend_right_of_the_data():
    fig = Figure()
    ax = fig.add_subplot()
    assert legend_outside(ax) is None  # nothing labelled, no empty legend
    ax.plot([0, 1], [0, 1], label="a")
    legend_outside(ax)
    assert _legends_outside(fig) == 1


@pytest.mark.parametrize("split", ["val", "adv", "train"])
def test_split_line_styles_differ(split):
    others = {split_linestyle(s) for s in ("val", "adv", "train") if s != split}
    assert split_linestyle(split) not in others


@pytest.mark.filterwarnings("ignore:BIF not converged")
def test_bif_rows_are_grouped_and_labelled():
    import numpy as np
    import torch
    from torch import nn

    from interp_toolkit.analyses.bif import SamplerConfig, bif, plot_bif

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(6, 3)

    def loss_fn(m, batch):
        return (m(batch).squeeze(-1) - 1.0) ** 2

    result = bif(model, x, x[:3], loss_fn, SamplerConfig(eps=1e-3, gamma=10.0, chains=2, draws=4, burn_in=2,
                                                          progress=False))
    agrees = np.array([True, False, True, True, False, True])
    fig = plot_bif(result, row_groups={"shortcut-consistent": agrees, "anti-shortcut": ~agrees})
    matrix = fig.axes[0].get_images()[0].get_array()
    expected = result.bif.double().numpy()[[0, 2, 3, 5, 1, 4]]  # consistent rows first, then anti
    assert np.allclose(np.asarray(matrix), expected)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["shortcut-consistent\n(4 rows)", "anti-shortcut\n(2 rows)"]
    assert "mean per group" in fig.axes[0].get_title()
    with pytest.raises(UserError, match="exactly one group"):
        plot_bif(result, row_groups={"a": agrees, "b": agrees})
    with pytest.raises(UserError, match="has 2 entries; the BIF has 6"):
        plot_bif(result, row_groups={"a": agrees[:2]})


def test_component_colours_are_distinct_and_never_the_whole_models_black():
    from matplotlib.colors import to_rgb

    from interp_toolkit.plotting import component_colors

    names = [f"L{layer}H{head}" for layer in range(4) for head in range(4)] + ["embed", "unembed", "ln", "mlp0",
                                                                               "mlp1", "mlp2", "other"]
    colors = component_colors(names)
    assert len(set(colors.values())) == len(names) == 23
    assert all(to_rgb(c) != (0.0, 0.0, 0.0) for c in colors.values())
