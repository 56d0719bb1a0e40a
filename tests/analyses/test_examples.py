"""Smoke test of examples/shortcut_mechanism.py at a tiny size."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shortcut_mechanism.py"


@pytest.mark.slow  # ~40 s on the shared 2-core machine (trains, then the mechanism on 3 checkpoints twice)
def test_shortcut_mechanism_example_tiny(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("shortcut_mechanism", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = ["--run-dir", str(tmp_path / "run"), "--n-train", "128", "--n-eval", "64", "--epochs", "2",
            "--checkpoint-every", "2", "--grad-n", "64", "--fingerprint-n", "64"]
    path = module.main(args)
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    assert path.with_suffix(".csv").is_file()  # the figure's data beside it
    out = capsys.readouterr().out
    assert "gradient conflict cos" in out and "L1H1: QK rho" in out and "phases: shortcut learned" in out
    # a rerun hits every cache: 5 analyses x checkpoints 0, 1, 2
    module.main(args)
    assert "(0 computed, 15 cached)" in capsys.readouterr().out


def _load(name):
    path = Path(__file__).resolve().parents[2] / "examples" / "reproduction" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_weight_norms_example_on_a_study(tiny_run, tmp_path, capsys):
    """examples/reproduction/weight_norms.py: finished runs only, tables, figure, decay shares."""
    import csv
    import json
    import shutil

    run_dir, _ = tiny_run
    study = tmp_path / "study"
    shutil.copytree(run_dir, study / "runs" / "finished")
    (study / "runs" / "finished" / "outcome.json").write_text(json.dumps({"generalized": False}))
    shutil.copytree(run_dir, study / "runs" / "still_training")  # no outcome.json: left out
    module = _load("weight_norms")
    module.main([str(study), "--out", str(tmp_path / "out"), "--name", "wn", "--from-epoch", "3"])
    out = capsys.readouterr().out
    assert "[1/1] finished: 6 computed, 0 cached" in out
    rows = list(csv.DictReader((tmp_path / "out" / "wn.csv").open()))
    assert {r["epoch"] for r in rows} == {"0", "1", "2", "3", "4", "6"} and {r["seed"] for r in rows} == {"0"}
    whole = {r["epoch"]: r for r in rows if r["group"] == "all"}  # measured against the run's epoch 0
    assert float(whole["0"]["cosine"]) == pytest.approx(1.0) and float(whole["0"]["distance"]) == 0
    assert float(whole["6"]["distance"]) > 0
    rates = list(csv.DictReader((tmp_path / "out" / "wn_rates.csv").open()))
    for rate in rates:  # epochs 4 -> 6 are the last two checkpoints from epoch 3 on
        assert (rate["from_epoch"], rate["to_epoch"]) == ("4", "6")
        expected = (float(rate["norm_to"]) / float(rate["norm_from"]) - 1) / 2
        assert float(rate["rate_per_step"]) == pytest.approx(expected)
    assert (tmp_path / "out" / "wn.png").read_bytes()[:4] == b"\x89PNG"
    assert "share of pure decay" in out and "1L r=0.75" in out
    shutil.rmtree(study / "runs" / "finished")
    with pytest.raises(SystemExit, match="no finished runs"):
        module.main([str(study), "--out", str(tmp_path / "o2")])
    with pytest.raises(SystemExit, match="not a sweep study directory"):
        module.main([str(tmp_path / "out"), "--out", str(tmp_path / "o2")])


def test_weight_norm_medians_skip_epochs_only_early_stopped_runs_have():
    module = _load("weight_norms")

    def row(seed, epoch, norm):
        return {"study": "s", "cell": "c", "seed": seed, "group": "all", "epoch": epoch, "norm": norm, "cosine": 1.0}

    rows = [row(seed, epoch, 2.0) for seed in (1, 2, 3) for epoch in (0, 10)]
    rows += [row(1, 7, 1.0), row(2, 20, 3.0), row(3, 20, 5.0)]  # seed 1 stopped at epoch 7
    epochs, values = module.median_series(rows, "norm")["c", "all"]
    assert epochs == [0, 10, 20] and values == [1.0, 1.0, 2.0]  # norm / norm at epoch 0, median of 2 runs


def _load_regime(name):
    path = Path(__file__).resolve().parents[2] / "examples" / "reproduction" / "regime" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounding_probe_bare_module_is_the_toolkit_model(monkeypatch):
    """examples/reproduction/regime/rounding_probe.py: the bare module loaded with the toolkit's
    weights computes the bridge's logits, and one epoch of each mode stays on one trajectory."""
    import torch

    from interp_toolkit.model import ModelConfig, build_model
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    probe = _load_regime("rounding_probe")
    task = MPSPConfig.from_task("max_parity_sum_parity", r=0.9, seq_len=6, n_values=10, n_train=256, n_eval=128,
                                seed=0)
    cfg = ModelConfig(n_layers=2, n_heads=2, seed=3, **task.model_dims())
    model = build_model(cfg).eval()
    for manual in (False, True):
        bare = probe.BareModel(cfg, manual_attention=manual).eval()
        bare.load_toolkit_weights({k: v.detach() for k, v in model.state_dict().items()})
        tokens = make_splits(task)["adv"].tokens
        with torch.no_grad():
            torch.testing.assert_close(bare(tokens), model(tokens)[:, -1], atol=1e-5, rtol=1e-5)

    bare.load_toolkit_weights({k: v.detach() for k, v in model.state_dict().items()})
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in bare.toolkit_state().items())

    monkeypatch.setattr(probe, "NEAR_MISS_FROM", 0.0)  # name the failing groups at any accuracy
    finals = {mode: probe.probe(mode, 3, 1, task, batch_size=64, weight_decay=1.0)[-1] for mode in probe.MODES}
    assert {row["epoch"] for row in finals.values()} == {1}
    for row in finals.values():  # 4 steps from one start: every mode agrees to within one example
        for split, n in (("train", 256), ("adv", 128)):
            assert abs(row[f"{split}_acc"] - finals["toolkit"][f"{split}_acc"]) <= 1 / n + 1e-9
        # the near-miss view is of the mode's own weights (bare ones copied back into the toolkit model)
        assert row["adv_wrong"] == round((1 - row["adv_acc"]) * 128)
        assert "wrong)" in row["adv_failing_groups"]
    with pytest.raises(ValueError, match="mode must be one of"):
        probe.probe("float16", 3, 1, task)

    # the continuation: one more epoch on a training split holding exactly 6 all-odd sequences
    rows = probe.probe("toolkit", 3, 1, task, batch_size=64, then_extreme_train=6, then_epochs=1)
    assert [(r["epoch"], r.get("continued", False)) for r in rows] == [(1, False), (2, True)]
    assert rows[1]["extreme_train"] == 6
    from interp_toolkit.tasks.mpsp import is_extreme_count
    extreme = is_extreme_count(make_splits(task)["adv"].values, 2)
    assert extreme.any()  # so the extreme-count accuracy is a number
    assert 0.0 <= rows[1]["adv_extreme_acc"] <= 1.0
    assert rows[1]["adv_extreme_acc"] * int(extreme.sum()) == pytest.approx(round(rows[1]["adv_extreme_acc"] * int(extreme.sum())))
