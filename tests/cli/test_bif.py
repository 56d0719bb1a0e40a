"""Test of the ``bif`` subcommand on a tiny MPSP checkpoint."""

from __future__ import annotations

import json

import torch

from interp_toolkit.analyses.bif.config import SamplerConfig
from interp_toolkit.checkpoint import save_checkpoint
from interp_toolkit.cli.bif import main, parse
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.tasks.mpsp import MPSPConfig

torch.set_num_threads(1)


def test_bif_subcommand_on_mpsp_checkpoint(tmp_path, capsys):
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    checkpoint = save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    args = [
        str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out", str(tmp_path / "out"),
        "--n-attribution", "16", "--n-query", "8", "--no-adaptive", "--chains", "2", "--draws", "5", "--burn-in", "5",
        "--batch-size", "32", "--eps", "1e-4", "--gamma", "100", "--no-progress",
    ]
    assert main(args) == 0
    (folder,) = (tmp_path / "out").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    assert (folder / "bif.png").exists() and (folder / "summary.json").exists()
    means = summary["mean_bif_on_query_loss"]
    assert means["shortcut_consistent_train_examples"] is not None
    assert summary["checkpoint_metadata"] == {"epoch": 10}
    assert summary["task"] == {"name": task.name, **task.to_dict()}
    assert summary["task_source"] == str(tmp_path / "task.json")
    # --format pdf: the rerun is a cache hit and adds the figure in the asked format
    assert main([*args, "--format", "pdf"]) == 0
    assert [p.name for p in (tmp_path / "out").glob("bif_*")] == [folder.name]
    assert (folder / "bif.pdf").read_bytes()[:4] == b"%PDF"
    capsys.readouterr()
    assert main([str(checkpoint), "--out", str(tmp_path / "o2")]) == 2
    assert "task config" in capsys.readouterr().err
    # every field of the command's configs is a flag, with the config's default
    parsed = parse([str(checkpoint), "--param-patterns", "blocks.*", "--keep-draws"])
    assert parsed.sampler.param_patterns == ("blocks.*",) and parsed.sampler.keep_draws
    assert parsed.sampler.eval_batch_size == SamplerConfig().eval_batch_size
    # --config FILE (JSON or YAML) sets fields; flags override it
    (tmp_path / "bif.yaml").write_text("n_query: 3\nsampler: {chains: 3, draws: 7}\n")
    parsed = parse([str(checkpoint), "--config", str(tmp_path / "bif.yaml"), "--draws", "9"])
    assert (parsed.n_query, parsed.sampler.chains, parsed.sampler.draws) == (3, 3, 9)
    assert parsed.sampler.batch_size == 256  # the command's own default survives the file
    (tmp_path / "bad.yaml").write_text("sampler: {chainz: 3}\n")
    capsys.readouterr()
    assert main([str(checkpoint), "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "chainz" in capsys.readouterr().err


def test_bif_reports_convergence_and_calibrates(tmp_path, capsys):
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    checkpoint = save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    common = [
        str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--n-attribution", "8", "--n-query", "4",
        "--no-adaptive", "--chains", "2", "--draws", "5", "--burn-in", "2", "--batch-size", "32", "--no-progress",
    ]
    assert main([*common, "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    (folder,) = (tmp_path / "out").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    # 2 chains x 5 draws cannot be trusted, and the summary and the output say so
    assert summary["convergence"]["converged"] is False and summary["convergence"]["warnings"]
    assert "NOT converged" in printed and (folder / "diagnostics.png").exists()
    assert main([*common, "--out", str(tmp_path / "cal"), "--calibrate", "--calibrate-eps", "1e-5", "1e-3",
                 "--calibrate-gamma", "100", "1e5"]) == 0
    (calibration,) = (tmp_path / "cal").glob("calibration_*.json")
    report = json.loads(calibration.read_text())
    assert sorted((row["eps"], row["gamma"]) for row in report["rows"]) == [
        (1e-5, 100), (1e-5, 1e5), (1e-3, 100), (1e-3, 1e5)]
    # an untrained checkpoint on 2 x 5 draws: no setting of this grid keeps its draws local, and a setting that
    # is not local is never recommended; the report and the output say why and what to try
    assert not any(row["local"] for row in report["rows"]) and calibration.with_suffix(".png").exists()
    assert report["recommended_setting"] is None and "NO setting was local" in report["reason"]
    printed = capsys.readouterr().out
    assert "recommended:" in printed
    import re

    for line in (line for line in printed.splitlines() if line.startswith("eps ")):
        # diagnostics at a readable precision: no number with more than 4 significant digits
        for number in re.findall(r"\d+\.\d+", line.split("e-")[0] + line.split(":", 1)[1]):
            assert len(number.replace(".", "").lstrip("0")) <= 4, (number, line)
    assert main([*common, "--calibrate", "--calibrate-eps", "-1"]) == 2
    assert "calibrate_eps" in capsys.readouterr().err


def test_bif_writes_beside_the_run_keeps_every_calibration_and_names_its_query(tmp_path, capsys, monkeypatch):
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.runs.mpsp import train_mpsp

    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    run_dir = tmp_path / "run"
    train_mpsp(task, ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()),
               TrainConfig(epochs=2, eval_every=1, progress=False), run_dir)
    monkeypatch.chdir(tmp_path)  # nothing lands where the command was started from
    common = [str(run_dir / "checkpoints" / "epoch_000002.safetensors"), "--n-attribution", "8", "--n-query", "4",
              "--no-adaptive", "--chains", "2", "--draws", "3", "--burn-in", "1", "--batch-size", "32", "--no-progress"]
    capsys.readouterr()
    assert main(common) == 0
    out = capsys.readouterr().out
    (folder,) = (run_dir / "analyses" / "bif").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["query"] == "the mean readout cross-entropy over 4 adv examples"
    assert "mean BIF of the training examples on the mean readout cross-entropy over 4 adv examples:" in out
    assert not (tmp_path / "runs").exists()
    for grid in (["1e-5", "1e-4"], ["1e-3"]):
        assert main([*common, "--calibrate", "--calibrate-eps", *grid]) == 0
    kept = sorted((run_dir / "analyses" / "bif").glob("calibration_*.json"))
    assert len(kept) == 2  # the second calibration did not overwrite the first
    assert sorted(len(json.loads(p.read_text())["rows"]) for p in kept) == [1, 2]


def test_bif_reports_locality_and_its_derived_gamma_and_refuses_a_bad_target(tmp_path, capsys):
    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    checkpoint = save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    common = [str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--n-attribution", "16",
              "--n-query", "8", "--no-adaptive", "--chains", "2", "--draws", "5", "--burn-in", "5", "--no-progress"]
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "auto")]) == 0
    captured = capsys.readouterr()
    (folder,) = (tmp_path / "auto").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    locality, found = summary["locality"], summary["localization"]
    assert locality["reference"] == "label-marginal cross-entropy" and locality["n_parameters"] > 0
    assert summary["sampler_used"]["gamma"] == found["gamma"] and summary["sampler_used"]["eps"] == found["eps"]
    assert summary["sampling_verdict"] == "not converged"  # 2 chains x 5 draws
    assert "sampling verdict: not converged" in captured.out and "locality: " in captured.out
    assert "note: localization: gamma" in captured.err
    # group means with their jackknife errors, in the summary and the output
    errors = summary["mean_bif_on_query_loss_stderr"]
    assert set(errors) == set(summary["mean_bif_on_query_loss"]) and all(e is None or e >= 0 for e in errors.values())
    assert "(jackknife)" in captured.out
    # --localize.no-auto keeps --gamma and --eps as given
    assert main([*common, "--out", str(tmp_path / "fixed"), "--localize.no-auto", "--gamma", "100",
                 "--eps", "1e-4"]) == 0
    (folder,) = (tmp_path / "fixed").glob("bif_*")
    fixed = json.loads((folder / "summary.json").read_text())
    assert fixed["localization"] is None and (fixed["sampler_used"]["gamma"], fixed["sampler_used"]["eps"]) == (
        100.0, 1e-4)
    capsys.readouterr()
    assert main([*common, "--localize.target", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "target" in err and "1.5" in err and err.count("error:") == 1 and "Traceback" not in err
