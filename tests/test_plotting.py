"""Every plot function returns a Figure, draws into given axes, and leaves the backend alone."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.analyses._common import Table
from interp_toolkit.analyses.bif import SamplerConfig, bif, plot_bif
from interp_toolkit.analyses.over_checkpoints import (
    ANALYSES,
    over_checkpoints,
    plot_over_checkpoints,
)
from interp_toolkit.errors import UserError
from interp_toolkit.plotting import (
    component_colors,
    label,
    save_figure,
)
from interp_toolkit.runs.trainer import plot_training_curves
from interp_toolkit.studies.lm.series import plot_per_class
from interp_toolkit.studies.mechanism.measure import MechanismConfig, mechanism_over_checkpoints
from interp_toolkit.studies.mechanism.plot import plot_mechanism
from interp_toolkit.studies.report.plots import plot_curves_by_cell, plot_rate_vs_r
from interp_toolkit.tasks.induction_corpus import CLASS_NAMES
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    task = MPSPConfig(seq_len=5, n_values=10, r=0.9, n_train=128, n_eval=64, seed=0)
    splits = make_splits(task)
    run_dir = tmp_path_factory.mktemp("plots") / "run"
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **task.model_dims()))
    result = train(model, splits, TrainConfig(epochs=4, eval_every=2, checkpoint_every=None, progress=False),
                   run_dir, run_info={"task": {"name": task.name, **task.to_dict()}})
    prints = over_checkpoints("fingerprints", run_dir, splits=splits, config={"n": 32}, plot=False,
                              progress=False)
    grads = over_checkpoints("gradients", run_dir, splits=splits, config={"n": 32}, plot=False,
                             progress=False)
    mechanism = mechanism_over_checkpoints(run_dir, MechanismConfig(grad_n=32, fingerprint_n=32, patching_n=16,
                                                                    ablation_n=32))
    return {"dir": run_dir, "metrics": result.metrics, "prints": prints, "grads": grads, "mechanism": mechanism}


@pytest.fixture(scope="module")
def bif_result():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(12, 3)

    def loss_fn(m, batch):
        return (m(batch).squeeze(-1) - 1.0) ** 2

    config = SamplerConfig(eps=1e-3, gamma=10.0, chains=2, draws=5, burn_in=5, progress=False)
    return bif(model, x, x[:4], loss_fn, config)


def _per_class_rows():
    rows = []
    for step in (0, 1, 2, 4, 8, 16):
        for i, cls in enumerate(CLASS_NAMES):
            rows.append({"reduction": "class:all", "train_group": cls, "step": step, "bif": 0.01 * i * step,
                         "stderr": 0.001, "induction_score": step / 16})
    return rows


def _cell_rows(run):
    return [{"task": "max_parity_sum_parity", "n_layers": 1, "n_heads": 2, "weight_decay": 0.1, "r": 0.9,
             "seed": seed, "run_dir": str(run["dir"])} for seed in (0, 1)]


# name -> (number of panels, draw(run, bif_result, ax) -> Figure)
PLOTS = {
    "plot_training_curves": (2, lambda run, res, ax: plot_training_curves(run["metrics"], ax=ax)),
    "plot_over_checkpoints": (1 + len(ANALYSES["fingerprints"].value_columns),
                              lambda run, res, ax: plot_over_checkpoints(run["prints"].table, run["dir"],
                                                                         ANALYSES["fingerprints"], ax=ax)),
    "plot_bif": (3, lambda run, res, ax: plot_bif(res, ax=ax)),
    "plot_rate_vs_r": (1, lambda run, res, ax: plot_rate_vs_r(
        Table.from_csv(ROOT / "docs" / "quick_table.csv").rows, ax=ax)),
    "plot_curves_by_cell": (1, lambda run, res, ax: plot_curves_by_cell(_cell_rows(run), ax=ax)),
    "plot_per_class": (1, lambda run, res, ax: plot_per_class(_per_class_rows(), ax=ax)),
    "plot_mechanism": (7, lambda run, res, ax: plot_mechanism(run["mechanism"], ax=ax)),
}


@pytest.fixture
def pdf_backend():
    # A non-interactive backend other than Agg: a plot function that switched the backend
    # (the old matplotlib.use("Agg")) would change it.
    original = matplotlib.get_backend()
    matplotlib.use("pdf")
    yield "pdf"
    matplotlib.use(original)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_plot_returns_figure_accepts_ax_keeps_backend(name, run, bif_result, pdf_backend, tmp_path):
    panels, draw = PLOTS[name]
    fig = draw(run, bif_result, None)
    assert isinstance(fig, Figure)
    assert matplotlib.get_backend() == pdf_backend
    assert sum(a.has_data() for a in fig.axes) >= min(panels, 1)

    host = Figure(figsize=(6, 3 * panels))
    axes = host.subplots(panels, 1, squeeze=False)[:, 0].tolist()
    drawn = draw(run, bif_result, axes if panels > 1 else axes[0])
    assert drawn is host  # drew into the caller's figure
    assert all(a.has_data() for a in axes)
    assert matplotlib.get_backend() == pdf_backend

    for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")):
        path = save_figure(fig, tmp_path / "figure", fmt)
        assert path.suffix == f".{fmt}" and path.read_bytes()[:len(magic)] == magic


def test_multi_panel_plot_refuses_wrong_number_of_axes(run):
    host = Figure()
    with pytest.raises(UserError, match="draws 2 panels"):
        plot_training_curves(run["metrics"], ax=[host.add_subplot()])


def test_component_colours_follow_layer_and_head():
    # Colours follow (layer, head), not the order in which a panel happens to list them.
    everything = component_colors(["L0H0", "L0H1", "L1H0", "L1H1"])
    assert len(set(everything.values())) == 4
    assert component_colors(["L1H1", "L0H0", "L0H1", "L1H0"]) == everything


def test_labels_are_human():
    assert label("adv_acc") == "adversarial accuracy"
    assert label("val_loss") == "validation cross-entropy loss"
    assert label("qk_rho") == "QK fingerprint (Spearman ρ)"
    assert label("some_column") == "some column"


def test_save_figure_rejects_unknown_format(tmp_path):
    with pytest.raises(UserError, match="figure format must be one of"):
        save_figure(Figure(), tmp_path / "x", "jpg")


def test_mpsp_split_label_names_each_split_by_its_role():
    from interp_toolkit.plotting import mpsp_split_label

    assert mpsp_split_label("adv") == "adversarial (anti-shortcut)"
    assert mpsp_split_label("val") == "validation (shortcut-consistent)"
    assert mpsp_split_label("train") == "training"


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_legends_sit_outside_the_data(name, run, bif_result):
    """Every legend of every toolkit figure is right of or above its axes (or in an axes that
    holds no data, such as the mechanism figure's key)."""
    _, draw = PLOTS[name]
    fig = draw(run, bif_result, None)
    fig.draw_without_rendering()
    legends = 0
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None or not ax.has_data():
            continue
        box, frame = legend.get_window_extent(), ax.get_window_extent()
        assert box.x0 >= frame.x1 - 1 or box.y0 >= frame.y1 - 1, f"{name}: a legend overlaps {ax.get_title()!r}"
        legends += 1
    assert legends >= 1


def test_curves_by_cell_names_a_cell_without_evaluations(run, tmp_path):
    from interp_toolkit.plotting import not_shown_notes

    waiting = tmp_path / "waiting_run"
    waiting.mkdir()
    rows = _cell_rows(run) + [{"task": "max_parity_sum_parity", "n_layers": 1, "n_heads": 2, "weight_decay": 0.1,
                               "r": 0.5, "seed": 0, "run_dir": str(waiting)}]
    fig = plot_curves_by_cell(rows)
    notes = not_shown_notes(fig)
    assert len(notes) == 1 and "no evaluations yet" in notes[0] and "r=0.5" in notes[0], notes
    assert "r=0.9" not in notes[0]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_plot_accuracies_draws_each_split_and_returns_its_epochs():
    from interp_toolkit.plotting import figure, plot_accuracies, split_linestyle

    metrics = [{"epoch": 0, "val_acc": 0.5, "adv_acc": 0.4, "val_loss": 1.0},
               {"epoch": 10, "val_acc": 0.9, "adv_acc": 0.1}]
    ax = figure().add_subplot()
    epochs = plot_accuracies(ax, metrics)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"validation", "adversarial"} and sorted(epochs) == [0, 0, 10, 10]
    assert list(lines["adversarial"].get_ydata()) == [0.4, 0.1]
    assert lines["validation"].get_linestyle() == split_linestyle("val") and ax.get_ylim() == (-0.02, 1.02)
