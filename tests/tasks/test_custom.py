"""A custom task is a first-class task: trained, recorded and analysed from the command line.

The worked example of docs/custom_tasks.md (``examples/custom_task.py``, a module outside
the package) is trained through ``interp_toolkit.cli.main`` and every command runs on its
run; a leaner task without ``.agrees`` or minimal pairs is refused by the commands that need
them, each naming what is missing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from interp_toolkit.cli import main
from interp_toolkit.tasks.custom import CustomTask, TaskSplits, normalize_spec, resolve_factory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom_task.py"
SETTINGS = {"r": 0.9, "n_train": 512, "n_eval": 128, "seq_len": 5}


def run_cli(capsys, *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def zero_run(tmp_path_factory) -> Path:
    """The worked example trained from the command line (1 layer, 24 full-batch epochs)."""
    run_dir = tmp_path_factory.mktemp("custom") / "zero"
    code = main(["train", "--task-factory", f"{EXAMPLE}:make_splits", "--task-settings", json.dumps(SETTINGS),
                 "--model.n-layers", "1", "--model.d-model", "32", "--model.d-mlp", "64", "--train.epochs", "24",
                 "--train.checkpoint-every", "8", "--train.eval-every", "8", "--train.no-progress",
                 "--run-dir", str(run_dir)])
    assert code == 0
    return run_dir


def test_the_run_records_the_factory_and_its_data(zero_run, capsys):
    record = json.loads((zero_run / "run.json").read_text())
    task = record["run_info"]["task"]
    assert task == {"name": "make_splits", "factory": f"{EXAMPLE}:make_splits", "settings": SETTINGS}
    rebuilt = CustomTask.from_dict(task).splits()
    assert sorted(record["identity"]["data"]) == sorted(rebuilt) == ["adv", "train", "val"]
    # the model's sizes follow the data: 5 values + readout, values 0..9 + readout token, 2 classes
    model = record["model_config"]
    assert (model["n_ctx"], model["d_vocab"], model["d_vocab_out"]) == (6, 11, 2)
    code, out, err = run_cli(capsys, "info", zero_run)
    assert code == 0, err
    assert '"factory": ' in out and "make_splits" in out and "task:  {}" not in out


def test_rerun_recomputes_nothing(zero_run, capsys):
    code, out, err = run_cli(capsys, "train", "--task-factory", f"{EXAMPLE}:make_splits", "--task-settings",
                             json.dumps(SETTINGS), "--model.n-layers", "1", "--model.d-model", "32",
                             "--model.d-mlp", "64", "--train.epochs", "24", "--train.checkpoint-every", "8",
                             "--train.eval-every", "8", "--train.no-progress", "--run-dir", zero_run)
    assert code == 0, err
    assert "already finished" in out


@pytest.mark.parametrize("analysis", ["fingerprints", "patching", "ablation", "gradients", "weight_norms"])
def test_analyze_runs_on_the_custom_task(zero_run, capsys, analysis):
    sample = [] if analysis == "weight_norms" else ["--n", "64"]
    code, out, err = run_cli(capsys, "analyze", zero_run, "--analysis", analysis, "--no-progress", *sample)
    assert code == 0, err
    rows = (zero_run / "analyses" / analysis / f"{analysis}.csv").read_text().splitlines()
    assert len(rows) > 1
    epochs = {line.split(",")[rows[0].split(",").index("epoch")] for line in rows[1:]}
    assert epochs == {"0", "1", "2", "4", "8", "16", "24"}


def test_patching_uses_the_tasks_own_minimal_pairs(zero_run):
    from interp_toolkit.analyses.patching import minimal_pair_patching
    from interp_toolkit.checkpoint import load_checkpoint

    splits = CustomTask(f"{EXAMPLE}:make_splits", SETTINGS).splits()
    pairs = splits["val"].minimal_pairs(seed=0)
    # one token apart, the first value kept, the label moved, the agreement flipped
    assert ((pairs.source.values != pairs.target.values).sum(1) == 1).all()
    assert (pairs.source.values[:, 0] == pairs.target.values[:, 0]).all()
    assert (pairs.source.labels != pairs.target.labels).all()
    assert bool(pairs.source.agrees.all()) and not bool(pairs.target.agrees.any())
    model, _ = load_checkpoint(zero_run / "checkpoints" / "epoch_000024.safetensors")
    result = minimal_pair_patching(model, splits, "val", "adv", n=16, kinds=["head"], positions=None)
    assert {row["n_pairs"] for row in result.rows} == {16}


def test_near_misses_names_the_mpsp_features_it_needs(zero_run, capsys):
    code, _, err = run_cli(capsys, "analyze", zero_run, "--analysis", "near_misses", "--no-progress")
    assert code == 2
    assert "MPSP" in err and "ZeroSplit" in err


def test_mechanism_and_influence_run_on_the_custom_task(zero_run, capsys):
    code, out, err = run_cli(capsys, "mechanism", zero_run)
    assert code == 0, err
    summary = json.loads((zero_run / "mechanism.json").read_text())
    assert summary["task"]["factory"].endswith("custom_task.py:make_splits")
    assert summary["outcome"]["modulus"] == 2 and summary["outcome"]["n_evaluations"] == len(
        (zero_run / "metrics.jsonl").read_text().splitlines())
    assert (zero_run / "mechanism.png").is_file()
    code, out, err = run_cli(capsys, "influence", zero_run, "--epochs", "24", "--n-query", "32",
                             "--n-consistent", "16", "--amplification-n", "64", "--draws", "4", "--burn-in", "4",
                             "--chains", "2", "--no-adaptive")
    assert code == 0, err
    assert (zero_run / "analyses" / "influence" / "influence.csv").is_file()


def test_bif_runs_on_the_custom_task(zero_run, capsys):
    code, out, err = run_cli(capsys, "bif", zero_run / "checkpoints" / "epoch_000024.safetensors", "--draws", "8",
                             "--burn-in", "4", "--chains", "2", "--n-attribution", "16", "--n-query", "16",
                             "--no-adaptive")
    assert code == 0, err
    summaries = list((zero_run / "analyses" / "bif").glob("bif_*/summary.json"))
    assert summaries
    summary = json.loads(summaries[0].read_text())
    assert summary["task"]["factory"].endswith("custom_task.py:make_splits")
    assert set(summary["mean_bif_on_query_loss"]) == {"shortcut_consistent_train_examples",
                                                      "shortcut_inconsistent_train_examples"}


LEAN_TASK = textwrap.dedent('''
    from types import SimpleNamespace
    import torch

    def make(n=64, seed=0):
        """Is the first token larger than the last? No shortcut, no minimal pairs."""
        gen = torch.Generator().manual_seed(seed)
        def split(k):
            values = torch.randint(0, 8, (n, 4), generator=gen)
            tokens = torch.cat([values, torch.full((n, 1), 8)], 1)  # the readout token 8 last
            return SimpleNamespace(tokens=tokens, labels=(values[:, 0] > values[:, -1]).long())
        return {"train": split(0), "val": split(1)}
''')


@pytest.fixture(scope="module")
def lean_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lean")
    (folder / "lean_task.py").write_text(LEAN_TASK)
    run_dir = folder / "run"
    code = main(["train", "--task-factory", f"{folder / 'lean_task.py'}:make", "--model.n-layers", "1",
                 "--model.d-model", "16", "--model.d-mlp", "32", "--train.epochs", "4", "--train.no-progress",
                 "--run-dir", str(run_dir)])
    assert code == 0
    return run_dir


@pytest.mark.parametrize(("argv", "named"), [
    (["analyze", "{run}", "--analysis", "patching", "--source", "val", "--target", "train"], ".agrees"),
    (["analyze", "{run}", "--analysis", "gradients"], ".agrees"),
    (["mechanism", "{run}"], "adv"),
    (["influence", "{run}"], "adv"),
])
def test_a_lean_task_is_refused_naming_what_it_lacks(lean_run, capsys, argv, named):
    code, out, err = run_cli(capsys, *[a.format(run=lean_run) for a in argv])
    assert code == 2, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], err


def test_a_lean_task_still_trains_and_analyses(lean_run, capsys):
    code, out, err = run_cli(capsys, "analyze", lean_run, "--analysis", "fingerprints", "--no-progress")
    assert code == 0, err
    code, out, err = run_cli(capsys, "bif", lean_run / "checkpoints" / "epoch_000004.safetensors", "--draws", "4",
                             "--burn-in", "2", "--chains", "2", "--n-attribution", "8", "--n-query", "8",
                             "--query-split", "val", "--no-adaptive")
    assert code == 0, err
    summary = json.loads(next((lean_run / "analyses" / "bif").glob("bif_*/summary.json")).read_text())
    assert set(summary["mean_bif_on_query_loss"]) == {"all_train_examples"}


def test_the_data_is_checked_against_the_run(lean_run, capsys):
    """A factory whose data changed since training is refused (fingerprints), not analysed."""
    source = lean_run.parent / "lean_task.py"
    original = source.read_text()
    source.write_text(original.replace("0, 8", "0, 7"))
    try:
        import sys

        for name in [m for m in sys.modules if m.startswith("interp_toolkit_task_")]:
            del sys.modules[name]  # the edited file is read afresh
        code, _, err = run_cli(capsys, "analyze", lean_run, "--analysis", "fingerprints", "--no-progress")
        assert code == 2 and "does not match the run's data" in err
    finally:
        source.write_text(original)
        for name in [m for m in sys.modules if m.startswith("interp_toolkit_task_")]:
            del sys.modules[name]


@pytest.mark.parametrize(("argv", "named"), [
    (["--task-factory", "no_such_module_xyz:make"], "no_such_module_xyz"),
    (["--task-factory", "{example}:nope"], "'nope'"),
    (["--task-factory", "not_a_registered_task"], "entry point"),
    (["--task-factory", "{example}:make_splits", "--task-settings", "{bad"], "not JSON"),
    (["--task-factory", "{example}:make_splits", "--task-settings", '{"colour": 1}'], "colour"),
    (["--task-factory", "{example}:make_splits", "--task.r", "0.5"], "--task.r"),
    (["--task-settings", '{"r": 0.5}'], "--task-factory"),
])
def test_bad_task_factories_are_one_error(capsys, tmp_path, argv, named):
    argv = [a.replace("{example}", str(EXAMPLE)) for a in argv]
    code, out, err = run_cli(capsys, "train", *argv, "--run-dir", tmp_path / "run", "--train.epochs", "1")
    assert code == 2, (out, err)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], err
    assert not (tmp_path / "run").exists()


def test_specs_module_file_and_entry_point(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text("def make(n=3):\n    return {'n': n}\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_factory("my_tasks:make")(n=5) == {"n": 5}  # found beside the caller, as python -m does
    assert normalize_spec("my_tasks.py:make") == f"{tmp_path / 'my_tasks.py'}:make"
    assert resolve_factory("my_tasks.py:make")() == {"n": 3}

    class EntryPoint:
        name = "mine"

        @staticmethod
        def load():
            return lambda: "loaded"

    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [EntryPoint()] if group ==
                        "interp_toolkit.tasks" else [])
    assert resolve_factory("mine")() == "loaded"


def test_task_splits_reserve_larger_vocabularies():
    split = type("S", (), {"tokens": torch.tensor([[0, 1]]), "labels": torch.tensor([1])})()
    task = CustomTask("x.py:f")
    task._splits = TaskSplits({"train": split}, d_vocab=9, d_vocab_out=4)
    assert task.model_dims() == {"d_vocab": 9, "n_ctx": 2, "d_vocab_out": 4}
    task._splits = TaskSplits({"train": split})
    assert task.model_dims() == {"d_vocab": 2, "n_ctx": 2, "d_vocab_out": 2}


def test_the_guides_python_runs(tmp_path, monkeypatch):
    """docs/custom_tasks.md's Python block, as written (run in a scratch folder)."""
    import re

    guide = (ROOT / "docs" / "custom_tasks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    code = next(b for b in blocks if "run_task" in b)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "custom_task.py").write_text(EXAMPLE.read_text())
    exec(compile(code.replace("epochs=40", "epochs=4"), "custom_tasks.md", "exec"), {})
    record = json.loads((tmp_path / "runs" / "zero" / "run.json").read_text())
    assert record["run_info"]["task"]["factory"] == f"{tmp_path / 'examples' / 'custom_task.py'}:make_splits"


def test_the_guides_refusals_are_the_commands(lean_run, capsys):
    """The two refusals docs/custom_tasks.md quotes are the commands' own words."""
    guide = (ROOT / "docs" / "custom_tasks.md").read_text()
    code, _, err = run_cli(capsys, "mechanism", lean_run)
    assert code == 2 and "holds no evaluation with val_acc and adv_acc" in err and \
        "holds no evaluation with val_acc and adv_acc" in guide
    code, _, err = run_cli(capsys, "analyze", lean_run, "--analysis", "gradients", "--no-progress")
    assert code == 2 and "split 'train' has no .agrees" in err and "split 'train' has no .agrees" in guide
