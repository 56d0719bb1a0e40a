"""The mechanism figure over checkpoints: tidy data, seven panels, head colours, cache, CLI."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
from matplotlib.figure import Figure

from interp_toolkit import ModelConfig, TrainConfig, build_model, train
from interp_toolkit.analyses._common import Table
from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.runs.trainer import list_checkpoints
from interp_toolkit.studies.common.outcomes import outcome_of_run
from interp_toolkit.studies.mechanism.measure import (
    ALL,
    PANEL_QUANTITIES,
    WHOLE_MODEL_QUANTITIES,
    MechanismConfig,
    mechanism_over_checkpoints,
    read_mechanism,
)
from interp_toolkit.studies.mechanism.plot import plot_mechanism, write_mechanism
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits
from tests.helpers import assert_fields_equal

SMALL = MechanismConfig(grad_n=128, grad_chunk_size=64, fingerprint_n=64, patching_n=32, ablation_n=64)
SMALL_FLAGS = ["--grad-n", "128", "--grad-chunk-size", "64", "--fingerprint-n", "64", "--patching-n", "32",
               "--ablation-n", "64", "--no-progress"]
HEAD = re.compile(r"^(L\d+H\d+) ")


def _train(root, n_layers: int, r: float = 0.9, epochs: int = 20, task_name: str = "max_parity_sum_parity"):
    task = MPSPConfig.from_task(task_name, seq_len=5, n_values=10, r=r, n_train=128, n_eval=64, seed=0)
    run_dir = root / f"run_{task_name}_{n_layers}L_r{r}"
    model = build_model(ModelConfig(n_layers=n_layers, n_heads=2, d_model=16, d_mlp=32, **task.model_dims()))
    train(model, make_splits(task), TrainConfig(epochs=epochs, eval_every=5, checkpoint_every=10,
                                                checkpoint_log_spaced=False, lr=3e-3, progress=False),
          run_dir, run_info={"task": {"name": task.name, **task.to_dict()}})
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny 1-layer and 2-layer run (20 epochs, checkpoints 0, 10, 20) and their mechanism results."""
    root = tmp_path_factory.mktemp("mechanism")
    out = {}
    for n_layers in (1, 2):
        run_dir = _train(root, n_layers)
        out[n_layers] = (run_dir, n_layers, mechanism_over_checkpoints(run_dir, SMALL))
    return out


@pytest.fixture(params=[1, 2], ids=["1L", "2L"])
def mech(request, runs):
    return runs[request.param]


@pytest.fixture
def one_run(runs):
    return runs[1]


def test_table_has_every_panel_quantity_for_every_checkpoint_and_head(mech):
    run_dir, n_layers, result = mech
    heads = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(2)]
    epochs = [e for e, _ in list_checkpoints(run_dir)]
    assert result.heads == heads and result.checkpoint_epochs == epochs == [0, 10, 20]
    assert result.table.columns == ["epoch", "head", "quantity", "value"]
    present = {(r["epoch"], r["head"], r["quantity"]) for r in result.rows}
    missing = []
    for quantities in PANEL_QUANTITIES.values():
        for quantity in quantities:
            owners = [ALL] if quantity in WHOLE_MODEL_QUANTITIES else heads
            missing += [(e, h, quantity) for e in epochs for h in owners if (e, h, quantity) not in present]
    assert not missing, missing[:10]
    assert {r["quantity"] for r in result.rows} == {q for qs in PANEL_QUANTITIES.values() for q in qs}
    # accuracies come from every evaluation in metrics.jsonl, not only the checkpoints
    assert result.series("acc_adv")[0] == [0, 5, 10, 15, 20]
    # the phases are the outcome module's (paper criteria), not a second definition
    assert result.outcome == outcome_of_run(run_dir, 0.9)


def test_gradient_and_ablation_values_are_the_analyses_own(mech):
    run_dir, _, result = mech
    grads = Table.from_csv(run_dir / "analyses" / "mechanism" / "gradients" / "gradients.csv")
    for row in grads.where(group="all").rows:
        (value,) = [r["value"] for r in result.rows if r["epoch"] == row["epoch"] and r["quantity"] == "amplification"]
        assert value == pytest.approx(row["amplification"])
        # r = 0.9: the anti-shortcut examples are the minority, so the paper's quantity is the same ratio
        (minority,) = [r["value"] for r in result.rows
                       if r["epoch"] == row["epoch"] and r["quantity"] == "minority_amplification"]
        assert row["minority"] == "anti" and minority == pytest.approx(row["amplification"])
    ablation = Table.from_csv(run_dir / "analyses" / "mechanism" / "ablation" / "ablation.csv")
    row = ablation.where(component="L0H1", split="adv", metric="accuracy").rows[-1]
    assert result.series("ablation_acc_adv", "L0H1")[1][-1] == pytest.approx(row["delta"])


@pytest.mark.parametrize("r, ylabel", [(0.25, "consistent / anti"), (0.5, "anti / consistent")])
def test_amplification_panel_is_of_the_minority_on_either_side_of_half(r, ylabel, tmp_path):
    """Below r = 0.5 the minority is the shortcut-consistent examples: the paper's amplification
    of the minority is then the inverse of anti / consistent. At 0.5 there is no minority, and the
    panel draws anti / consistent, named as such."""
    result = mechanism_over_checkpoints(_train(tmp_path, 1, r=r, epochs=10), SMALL)
    for head, kind in [(ALL, ""), ("L0H0", "_qk"), ("L0H1", "_ov")]:
        epochs, anti_over_consistent = result.series(f"amplification{kind}", head)
        minority_epochs, minority = result.series(f"minority_amplification{kind}", head)
        if r == 0.5:
            assert minority_epochs == []
        else:
            assert minority_epochs == epochs == [0, 10]
            assert minority == pytest.approx([1 / v for v in anti_over_consistent])
    amplification_panel = plot_mechanism(result).axes[2]
    assert ylabel in amplification_panel.get_ylabel()
    drawn = [line for line in amplification_panel.get_lines() if line.get_label() == "all parameters"]
    expected = result.series("minority_amplification" if r < 0.5 else "amplification")[1]
    assert list(drawn[0].get_ydata()) == pytest.approx(expected)


def test_figure_has_seven_log_scaled_panels_and_one_colour_per_head(mech):
    _, n_layers, result = mech
    fig = plot_mechanism(result)
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.has_data()]
    assert len(panels) == 7
    assert all(ax.get_xscale() == "symlog" for ax in panels)
    assert len({ax.get_xlim() for ax in panels}) == 1  # one shared epoch axis
    colours: dict[str, set[str]] = {}
    panels_of: dict[str, set[int]] = {}
    for i, ax in enumerate(panels):
        for line in ax.get_lines():
            match = HEAD.match(str(line.get_label()))
            if match:
                colours.setdefault(match.group(1), set()).add(line.get_color())
                panels_of.setdefault(match.group(1), set()).add(i)
    assert sorted(colours) == result.heads
    assert all(len(c) == 1 for c in colours.values()), colours  # the same colour in every panel
    assert len({next(iter(c)) for c in colours.values()}) == 2 * n_layers  # and a different one per head
    assert all(p == {1, 2, 3, 4, 5, 6} for p in panels_of.values())  # every head in panels 2-7


def test_phase_markers_are_drawn_in_every_panel(mech):
    _, _, result = mech
    marked = dataclasses.replace(result, outcome={**result.outcome, "shortcut_epoch": 10,
                                                  "phase2_onset_epoch": 15, "first_generalized_epoch": None})
    fig = plot_mechanism(marked)
    accuracy = fig.axes[0]
    labels = accuracy.get_legend_handles_labels()[1]
    assert "shortcut learned (epoch 10)" in labels and "phase 2 onset (epoch 15)" in labels
    assert not any(label.startswith("generalized") for label in labels)
    for ax in fig.axes[:7]:  # the eighth is the key
        vertical = {line.get_xdata()[0] for line in ax.get_lines() if len(set(line.get_xdata())) == 1
                    and line.get_linestyle() in ("--", ":")}
        assert {10, 15} <= vertical


def test_plot_draws_into_given_axes_and_refuses_a_wrong_number(mech):
    _, _, result = mech
    host = Figure()
    axes = host.subplots(7, 1)
    assert plot_mechanism(result, ax=list(axes)) is host
    with pytest.raises(UserError, match="draws 7 panels"):
        plot_mechanism(result, ax=list(axes)[:5])


def test_rerun_is_a_cache_hit_and_a_changed_setting_recomputes_only_its_analysis(mech):
    run_dir, _, first = mech
    cache = sorted((run_dir / "analyses" / "mechanism").rglob("cache/*.json"))
    assert len(cache) == 5 * len(first.checkpoint_epochs)
    stamps = {p: p.stat().st_mtime_ns for p in cache}
    again = mechanism_over_checkpoints(run_dir, SMALL)
    assert again.n_computed == 0 and again.n_cached == 5 * len(first.checkpoint_epochs)
    assert {p: p.stat().st_mtime_ns for p in cache} == stamps  # no cache file rewritten
    assert_fields_equal(again.rows, first.rows)  # a blank patching effect (NaN) included
    changed = mechanism_over_checkpoints(run_dir, dataclasses.replace(SMALL, patching_n=16))
    assert {k for k, v in changed.computed.items() if v} == {"patching_val_to_adv", "patching_adv_to_val"}


def test_write_puts_table_and_summary_beside_the_figure(mech, tmp_path):
    _, _, result = mech
    written = write_mechanism(result, tmp_path / "fig.svg")
    assert written["figure"] == tmp_path / "fig.svg" and written["figure"].read_bytes()[:5] == b"<?xml"
    table = Table.from_csv(tmp_path / "fig.csv")
    assert len(table) == len(result.table) and table.columns == ["epoch", "head", "quantity", "value"]
    summary = json.loads((tmp_path / "fig.json").read_text())
    assert summary["outcome"] == result.outcome and summary["settings"]["grad_n"] == 128
    # the figure redraws from its data alone: the same lines as from the live result
    back = read_mechanism(tmp_path / "fig.svg")
    assert back.heads == result.heads and back.outcome == result.outcome and back.config == result.config

    def lines(fig):
        return [[(str(line.get_label()), list(map(float, line.get_xdata())), list(map(float, line.get_ydata())))
                 for line in ax.get_lines()] for ax in fig.axes]

    assert lines(plot_mechanism(back)) == lines(plot_mechanism(result))  # CSV floats round-trip exactly
    (tmp_path / "fig.json").unlink()
    with pytest.raises(UserError, match="fig.json does not exist"):
        read_mechanism(tmp_path / "fig.csv")


def test_config_rejects_bad_sizes():
    with pytest.raises(UserError, match="grad_n must be a positive integer, got 0"):
        MechanismConfig(grad_n=0)
    with pytest.raises(UserError, match="ablation_method"):
        MechanismConfig(ablation_method="median")


def test_mod3_run_reads_its_modulus_from_the_run_record(tmp_path):
    run_dir = _train(tmp_path, 1, r=0.9, epochs=2, task_name="max_mod3_sum_mod3")
    result = mechanism_over_checkpoints(run_dir, SMALL)
    assert result.outcome["modulus"] == 3 and result.task["name"] == "max_mod3_sum_mod3"
    assert result.outcome == outcome_of_run(run_dir, 0.9, modulus=3)
    quantities = {r["quantity"] for r in result.rows if r["head"] == "L0H1" and r["epoch"] == 2}
    assert {"ov_rho", "patch_val_to_adv", "ablation_acc_adv", "grad_cos_qk"} <= quantities


def test_run_without_anti_shortcut_examples_is_refused_before_any_work(tmp_path):
    run_dir = _train(tmp_path, 1, r=1.0, epochs=2)
    with pytest.raises(UserError, match=r"r = 1.0.*all shortcut-consistent"):
        mechanism_over_checkpoints(run_dir, SMALL)
    assert not (run_dir / "analyses").exists()


# ----------------------------------------------------------------------------- CLI

def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_writes_figure_table_and_summary_then_hits_the_cache(one_run, tmp_path, capsys):
    run_dir, _, _ = one_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    code, out, err = _cli(capsys, "mechanism", copy, "--out", tmp_path / "out" / "fig.pdf", *SMALL_FLAGS)
    assert code == 0, err
    assert (tmp_path / "out" / "fig.pdf").read_bytes()[:4] == b"%PDF"
    assert (tmp_path / "out" / "fig.csv").is_file() and (tmp_path / "out" / "fig.json").is_file()
    assert "0 analyses computed, 15 from cache" in out  # the copied run brought its cache along
    epochs, values = one_run[2].series("minority_amplification")
    assert f"epoch {epochs[-1]}: gradient cosine" in out and f"minority amplification {values[-1]:.2f}" in out
    code, out, _ = _cli(capsys, "mechanism", copy, "--format", "svg", *SMALL_FLAGS)
    assert code == 0 and (copy / "mechanism.svg").is_file() and (copy / "mechanism.csv").is_file()


@pytest.mark.parametrize("argv, needle", [
    (["mechanism", "NOWHERE"], "does not exist"),
    (["mechanism", "EMPTY"], "is not a run directory (no run.json)"),
    (["mechanism", "NOCKPT"], "has no checkpoints"),
    (["mechanism", "RUN", "--out", "OUT/fig.png", "--format", "pdf"], "suffix .png but --format is pdf"),
    (["mechanism", "RUN", "--grad-n", "0"], "grad_n must be a positive integer"),
    (["mechanism", "RUN", "--format", "gif"], "gif"),
    (["mechanism", "RUN", "--threads", "0"], "threads must be a positive integer"),
    (["mechanism", "RUN", "--epochs", "7"], "no checkpoint for epochs [7]"),
    (["mechanism", "RUN", "--device", "gpu0"], "gpu0"),
    (["mechanism"], "needs a RUN_DIR"),
])
def test_cli_bad_input_is_one_error_line_exit_2_and_writes_nothing(argv, needle, one_run, tmp_path, capsys):
    run_dir, _, _ = one_run
    (tmp_path / "empty").mkdir()
    no_checkpoints = tmp_path / "nockpt"
    shutil.copytree(run_dir, no_checkpoints, ignore=shutil.ignore_patterns("checkpoints", "analyses"))
    before = sorted(p.name for p in run_dir.iterdir())
    paths = {"NOWHERE": tmp_path / "nowhere", "EMPTY": tmp_path / "empty", "NOCKPT": no_checkpoints,
             "RUN": run_dir, "OUT/fig.png": tmp_path / "out" / "fig.png"}
    code, _, err = _cli(capsys, *[paths.get(a, a) for a in argv])
    assert code == 2, err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1, err
    assert needle in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.rglob("mechanism.*"))
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_cli_help_imports_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, interp_toolkit.cli as c; rc = c.main(['mechanism', '--help']); "
            "print(rc, 'torch' in sys.modules, 'matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "--grad-n" in done.stdout and "--format" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "0 False False"


def test_a_run_short_of_the_criterion_names_its_near_miss(mech, tmp_path):
    run_dir, _, result = mech
    from interp_toolkit.studies.common.near_miss import NEAR_MISS_FIELDS, near_miss_of_run

    if result.outcome["generalized"]:
        assert result.near_miss == {}
    else:
        near = near_miss_of_run(run_dir)
        assert result.near_miss == {**near.fields(), "text": near.describe()}
        assert set(NEAR_MISS_FIELDS) < set(result.near_miss)
        assert result.near_miss["best_adv_acc"] == result.outcome["max_adv_acc"]
        assert "still wrong" in plot_mechanism(result).get_suptitle()
    # a near miss with its group, as near_miss_of_run describes one, is in the title and the summary
    text = "adv accuracy peaked at 99.37% (epoch 100): 13 of 2048 still wrong, all in n_odd=8 (13 of 13 wrong)"
    near_miss = dataclasses.replace(result, outcome={**result.outcome, "generalized": False},
                                    near_miss={"n_adv_wrong_at_best": 13, "text": text})
    title = plot_mechanism(near_miss).get_suptitle()
    assert "13 of 2048 still wrong" in title and "n_odd=8 (13 of 13 wrong)" in title
    write_mechanism(near_miss, tmp_path / "fig.png")
    assert read_mechanism(tmp_path / "fig.png").near_miss == near_miss.near_miss
    generalized = dataclasses.replace(near_miss, outcome={**result.outcome, "generalized": True,
                                                          "first_generalized_epoch": 10})
    assert "still wrong" not in plot_mechanism(generalized).get_suptitle()


def test_a_cached_rerun_reads_one_file_and_imports_no_torch(one_run, tmp_path, capsys):
    """A full cache hit loads no model and no torch, and draws nothing when the figure and its
    data beside it are the ones written for the same result; an edited cached result is
    recomputed, never served."""
    import subprocess
    import sys

    from interp_toolkit.studies.mechanism.measure import read_cached_result, result_key

    run_dir, _, result = one_run
    first = mechanism_over_checkpoints(run_dir, SMALL)  # the fixture's run wrote the result entry
    assert first.cache_key and first.n_computed == 0
    assert_fields_equal(first.rows, result.rows)
    assert first.outcome == result.outcome and first.near_miss == result.near_miss
    written = write_mechanism(first, tmp_path / "m.png")
    stamps = {name: path.stat().st_mtime_ns for name, path in written.items()}
    code = ("import sys; from pathlib import Path; from interp_toolkit.studies.mechanism.measure import *; from "
            "interp_toolkit.studies.mechanism.plot import write_mechanism; "
            f"r = mechanism_over_checkpoints(Path({str(run_dir)!r}), MechanismConfig(**{SMALL.to_dict()!r})); "
            f"write_mechanism(r, Path({str(tmp_path / 'm.png')!r})); "
            "print(r.n_computed, r.n_cached, 'torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", str(5 * len(first.checkpoint_epochs)), "False", "False"]
    assert {name: path.stat().st_mtime_ns for name, path in written.items()} == stamps  # nothing rewritten
    # a changed file beside the figure is written again
    written["table"].write_text("edited\n")
    write_mechanism(first, tmp_path / "m.png")
    assert Table.from_csv(written["table"]).columns == ["epoch", "head", "quantity", "value"]

    key = result_key(run_dir, SMALL, list_checkpoints(run_dir))
    assert key == first.cache_key
    entry_path = run_dir / "analyses" / "mechanism" / "results" / f"{key}.json"
    entry = json.loads(entry_path.read_text())
    entry["rows"][0]["value"] = 123.0  # an edited number
    entry_path.write_text(json.dumps(entry))
    assert read_cached_result(run_dir, key) is None
    assert "recomputing the cached result" in capsys.readouterr().err
    again = mechanism_over_checkpoints(run_dir, SMALL)
    assert_fields_equal(again.rows, result.rows)  # recomputed (from the per-checkpoint caches)
    assert read_cached_result(run_dir, key) is not None  # and stored again


def test_the_title_speaks_of_the_runs_own_task(mech):
    """A custom task's title names its factory settings (whatever their keys), an MPSP task's
    its r, length and n; neither shows a key the task does not record."""
    _, _, result = mech
    custom = dataclasses.replace(result, task={"name": "majority", "factory": "/x/tasks.py:majority",
                                               "settings": {"n_bits": 7, "r": 0.9}})
    first = plot_mechanism(custom).get_suptitle().splitlines()[0]
    assert "majority (n_bits=7, r=0.9)" in first and "None" not in first and "MPSP" not in first
    mpsp = plot_mechanism(result).get_suptitle().splitlines()[0]
    assert f"r = {result.task['r']}" in mpsp and "None" not in mpsp
