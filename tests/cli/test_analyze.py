from interp_toolkit.analyses._common import Table
from interp_toolkit.cli import main


def test_analyze_writes_csv_and_png_into_the_run(tiny_run, tmp_path, capsys):
    import shutil

    run_dir, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    argv = ["analyze", str(copy), "--analysis", "gradients", "--n", "32", "--chunk-size", "16", "--epochs", "0", "6",
            "--no-progress"]
    assert main(argv) == 0
    # a subset of the checkpoints (0 and 6 of 0, 1, 2, 3, 4, 6) is named by its epochs
    csv = copy / "analyses" / "gradients" / "gradients_epochs_0_6.csv"
    assert csv.is_file() and (copy / "analyses" / "gradients" / "gradients_epochs_0_6.png").is_file()
    table = Table.from_csv(csv)
    assert sorted(set(table.column("epoch"))) == [0, 6]
    assert "amplification" in table.columns
    assert "2 checkpoint(s) computed" in capsys.readouterr().out
    # the rerun is served from the cache
    assert main(argv) == 0
    assert "0 checkpoint(s) computed, 2 from cache" in capsys.readouterr().out


def test_analyze_patching_options(tiny_run, tmp_path):
    run_dir, _ = tiny_run
    assert main(["analyze", str(run_dir), "--analysis", "patching", "--last", "--n", "16",
                 "--positions", "all", "--out-dir", str(tmp_path), "--no-progress"]) == 0
    table = Table.from_csv(tmp_path / "patching_epochs_6.csv")
    assert set(table.column("position")) == {-1} and set(table.column("epoch")) == {6}
    assert set(table.column("metric")) == {"pair_logit_diff"} and set(table.column("n_pairs")) == {16}


def test_analyze_resample_ablation_damage_and_metric_scope(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    assert main(["analyze", str(run_dir), "--analysis", "resample_ablation_damage", "--last",
                 "--n", "16", "--positions", "all", "--metric", "accuracy",
                 "--out-dir", str(tmp_path), "--no-progress"]) == 0
    table = Table.from_csv(tmp_path / "resample_ablation_damage_epochs_6.csv")
    assert set(table.column("metric")) == {"accuracy"}
    assert main(["analyze", str(run_dir), "--analysis", "patching", "--metric", "loss"]) == 2
    assert "--metric applies to resample_ablation_damage only" in capsys.readouterr().err


def test_analyze_bad_input(tiny_run, capsys):
    run_dir, _ = tiny_run
    assert main(["analyze", str(run_dir), "--analysis", "fingerprints", "--method", "zero"]) == 2
    assert "--method applies to ablation only" in capsys.readouterr().err
    assert main(["analyze", str(run_dir), "--analysis", "ablation", "--epochs", "99"]) == 2
    assert "no checkpoint for epochs [99]" in capsys.readouterr().err


def test_analyze_near_misses(tiny_run, tmp_path, capsys):
    run_dir, splits = tiny_run
    assert main(["analyze", str(run_dir), "--analysis", "near_misses", "--last", "--split-names", "adv",
                 "--out-dir", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "near_misses: 1 checkpoint(s) computed" in out
    table = Table.from_csv(tmp_path / "near_misses_epochs_6.csv")
    assert set(table.column("split")) == {"adv"} and set(table.column("epoch")) == {6}
    assert {"n_odd", "label", "shortcut", "max", "max_count", "max_position"} == set(table.column("feature"))
    n_odd = table.where(feature="n_odd").rows
    assert sum(r["n"] for r in n_odd) == len(splits["adv"])
    assert (tmp_path / "near_misses_epochs_6.png").is_file()
    assert main(["analyze", str(run_dir), "--analysis", "near_misses", "--method", "zero"]) == 2
    assert "--method applies to ablation only" in capsys.readouterr().err


def test_a_subset_never_overwrites_the_full_result(tiny_run, tmp_path, capsys):
    """``--last``, ``--epochs`` and a config file with ``last: true`` write beside the full
    result; rerunning a selection is a cache hit and leaves the full files as they were."""
    import shutil

    run_dir, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "analyses", ignore_errors=True)
    base = ["analyze", str(copy), "--analysis", "fingerprints", "--n", "16", "--no-progress"]
    folder = copy / "analyses" / "fingerprints"
    assert main(base) == 0
    full_csv, full_png = folder / "fingerprints.csv", folder / "fingerprints.png"
    full_rows = Table.from_csv(full_csv).rows
    assert sorted(set(r["epoch"] for r in full_rows)) == [0, 1, 2, 3, 4, 6]
    full_text, full_figure = full_csv.read_text(), full_png.read_bytes()

    config = tmp_path / "an.yaml"
    config.write_text("last: true\n")
    assert main(base + ["--last"]) == 0
    assert main(base + ["--config", str(config)]) == 0
    assert main(base + ["--epochs", "0", "6"]) == 0
    out = capsys.readouterr().out
    assert full_csv.read_text() == full_text and full_png.read_bytes() == full_figure
    assert set(Table.from_csv(folder / "fingerprints_epochs_6.csv").column("epoch")) == {6}
    assert set(Table.from_csv(folder / "fingerprints_epochs_0_6.csv").column("epoch")) == {0, 6}
    assert (folder / "fingerprints_epochs_6.png").is_file()
    # every subset was served from the full run's per-checkpoint cache
    assert out.count("0 checkpoint(s) computed") == 3

    assert main(base + ["--last"]) == 0
    assert "0 checkpoint(s) computed, 1 from cache" in capsys.readouterr().out
    # every epoch given explicitly is the full selection
    assert main(base + ["--epochs", "0", "1", "2", "3", "4", "6"]) == 0
    assert f"table: {full_csv}" in capsys.readouterr().out
