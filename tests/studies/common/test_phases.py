"""The two phases of a run in words and in a figure (describe_phases, plot_phases)."""

import matplotlib.colors as mcolors
import pytest

from interp_toolkit.studies.common.outcomes import compute_outcome, describe_phases, plot_phases


def _metrics(adv_by_epoch, val=1.0):
    return [{"epoch": e, "val_acc": val if e > 0 else 0.5, "adv_acc": a, "train_acc": 0.9}
            for e, a in adv_by_epoch]


TWO_PHASES = _metrics([(0, 0.5), (10, 0.02), (20, 0.01), (30, 0.05), (40, 0.3), (50, 0.8), (60, 1.0)])
STUCK = _metrics([(0, 0.5), (10, 0.02), (20, 0.01), (30, 0.02), (40, 0.03)])


def test_two_phases_named_with_their_epochs():
    outcome = compute_outcome(TWO_PHASES, r=0.9)
    lines = describe_phases(outcome, TWO_PHASES)
    assert lines[0].startswith("phase 1 (shortcut): from epoch 10")
    assert lines[1].startswith("phase 2 (rule)") and "epoch 20" in lines[1] and "epoch 60" in lines[1]
    assert "1.0%" in lines[1]  # the low of the adversarial accuracy, at the onset


def test_a_run_that_never_leaves_the_shortcut_says_so():
    outcome = compute_outcome(STUCK, r=0.9)
    lines = describe_phases(outcome, STUCK)
    assert lines[0].startswith("phase 1 (shortcut)")
    assert lines[1] == "phase 2 (rule): not within 40 epochs (adv accuracy at most 50.0%)"


def test_chance_has_no_shortcut_phase():
    metrics = _metrics([(0, 0.5), (10, 0.7), (20, 1.0)], val=1.0)
    lines = describe_phases(compute_outcome(metrics, r=0.5), metrics)
    assert len(lines) == 1 and lines[0].startswith("no shortcut phase") and "epoch 20" in lines[0]


@pytest.mark.parametrize("metrics, shaded", [(TWO_PHASES, 2), (STUCK, 1)])
def test_plot_shades_each_phase_reached(metrics, shaded):
    outcome = compute_outcome(metrics, r=0.9)
    fig = plot_phases(metrics, outcome)
    (ax,) = fig.axes
    spans = [p for p in ax.patches if mcolors.to_rgba(p.get_facecolor())[3] < 0.5]
    assert len(spans) == shaded
    labels = ax.get_legend_handles_labels()[1]
    assert ("phase 2: rule takes over" in labels) == (shaded == 2)
    assert ax.get_xscale() == "symlog"
