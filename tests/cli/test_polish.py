"""Command-line polish, each through ``interp_toolkit.cli.main``: positional arguments read as
their names in ``--help``, and loading checkpoints prints no TransformerLens device lines."""

from __future__ import annotations

import pytest

from interp_toolkit.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("command", "name"), [("info", "CHECKPOINT"), ("mechanism", "RUN_DIR"),
                                                ("analyze", "RUN_DIR"), ("bif", "CHECKPOINT")])
def test_required_positional_is_shown_by_name(capsys, command, name):
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0, err
    usage = out.splitlines()[0]
    assert usage.endswith(f" {name}"), usage
    assert "{None}|PATH" not in usage
    positional = out.split("positional arguments", 1)[1].split("options", 1)[0]
    assert name in positional and "(required)" in positional
    assert "(default: None)" not in positional


@pytest.mark.parametrize(("command", "name"), [("info", "CHECKPOINT"), ("mechanism", "RUN_DIR"),
                                                ("analyze", "RUN_DIR"), ("bif", "CHECKPOINT")])
def test_missing_positional_is_one_user_error(capsys, command, name):
    code, out, err = run_cli(capsys, command)
    assert code == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip()]
    assert name in err


def test_loading_checkpoints_prints_no_device_lines(capsys, tiny_run):
    """``analyze`` loads every checkpoint of the run (six here) onto the CPU; TransformerLens
    would print "Moving model to device: cpu" for each."""
    run_dir, _ = tiny_run
    code, out, err = run_cli(capsys, "analyze", run_dir, "--analysis", "fingerprints", "--device", "cpu",
                             "--no-progress")
    assert code == 0, err
    assert any(path.suffix == ".csv" for path in run_dir.rglob("*fingerprints*"))
    assert "Moving model" not in out + err


def test_move_model_moves_without_printing(capsys, small_model_cfg):
    import torch

    from interp_toolkit.model import build_model, move_model

    model = build_model(small_model_cfg)
    capsys.readouterr()
    moved = move_model(model, torch.device("cpu"))
    assert capsys.readouterr().out == ""
    assert moved is model and next(model.parameters()).device.type == "cpu"
    plain = move_model(torch.nn.Linear(2, 2), "cpu")
    assert isinstance(plain, torch.nn.Linear)


def test_mechanism_names_phases_not_reached(capsys, tiny_run, tmp_path):
    """A run that never reached a phase reads "not ... within N epochs", never "epoch None"."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run[0], run_dir)
    code, out, err = run_cli(capsys, "mechanism", run_dir, "--out", tmp_path / "mechanism.png", "--grad-n", "64",
                             "--grad-chunk-size", "64", "--fingerprint-n", "32", "--patching-n", "16",
                             "--ablation-n", "32", "--no-progress")
    assert code == 0, err
    (phases,) = [line for line in out.splitlines() if line.startswith("phases: ")]
    assert "None" not in phases
    assert "generalized at epoch" in phases or "not generalized within 6 epochs" in phases


def test_phases_summary_words():
    from interp_toolkit.cli.mechanism import phases_summary

    never = {"favored_split": "val", "shortcut_epoch": None, "phase2_onset_epoch": None,
             "first_generalized_epoch": None, "final_epoch": 60}
    assert phases_summary(never) == ("shortcut not learned within 60 epochs, no phase 2 onset within 60 epochs, "
                                     "not generalized within 60 epochs")
    both = {**never, "shortcut_epoch": 5, "phase2_onset_epoch": 20, "first_generalized_epoch": 40}
    assert phases_summary(both) == "shortcut learned at epoch 5, phase 2 onset at epoch 20, generalized at epoch 40"
    chance = {**never, "favored_split": None, "first_generalized_epoch": 12}
    assert phases_summary(chance) == "no shortcut phase (r at chance), generalized at epoch 12"


@pytest.mark.parametrize("command", ["bif", "bif-lm"])
def test_bif_help_opens_with_what_the_command_does_in_plain_text(capsys, command):
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0, err
    description = out.split("\n\n")[1]
    assert not description.startswith("Command line"), description
    assert "Bayesian influence" in description or "BIF" in description
    assert "``" not in out and ":class:" not in out


def test_bif_lm_positional_is_named(capsys):
    code, out, err = run_cli(capsys, "bif-lm", "--help")
    assert code == 0, err
    assert "CHECKPOINTS" in out.splitlines()[0] and "[STR" not in out.splitlines()[0]


def test_bif_takes_a_run_directory_as_its_last_checkpoint(capsys, tiny_run, tmp_path):
    run_dir, _ = tiny_run
    code, out, err = run_cli(capsys, "bif", run_dir, "--out", tmp_path / "bif", "--n-attribution", "8",
                             "--n-query", "4", "--no-adaptive", "--chains", "2", "--draws", "4", "--burn-in", "0",
                             "--no-progress")
    assert code == 0, err
    assert "does not exist" not in err
    assert f"checkpoint: {run_dir / 'checkpoints' / 'epoch_000006.safetensors'}" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run_cli(capsys, "bif", empty)
    assert code == 2 and err.strip() == (f"error: {empty} is a directory without checkpoints; expected a "
                                         f".safetensors checkpoint or a run directory with "
                                         f"{empty}/checkpoints/epoch_*.safetensors")


@pytest.mark.parametrize("command", ["train", "sweep", "analyze", "mechanism", "mechanism-contrast", "bif", "bif-lm",
                                     "influence", "report", "info", "demo"])
def test_help_offers_no_none_choice_and_no_docstring_markup(capsys, command):
    code, out, err = run_cli(capsys, command, "--help")
    assert code == 0, err
    assert "{None" not in out and "``" not in out, [line for line in out.splitlines() if "None" in line or "``" in line]
    assert "--" in out and len(out.splitlines()) > 5  # the help itself is still there
    boxed = [line for line in out.splitlines() if line.startswith("│")]
    assert len({len(line) for line in boxed}) <= 1  # every boxed line keeps its right border in place


def test_clean_help_keeps_a_box_border_in_place():
    from interp_toolkit.config import clean_help

    line = "│ --n {None}|INT   Examples, see ``n``. │"
    cleaned = clean_help(line)
    assert cleaned == "│ --n INT   Examples, see n." + " " * 12 + "│" and len(cleaned) == len(line)
