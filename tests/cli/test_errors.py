"""Bad input to the command line: every case exits 2 with one ``error:`` line naming the bad
value, prints no traceback and leaves no file behind.

The cases run in-process through :func:`interp_toolkit.cli.main` (a subprocess costs
seconds each here); argparse's own refusals raise ``SystemExit(2)``, which counts as exit 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from interp_toolkit.cli import main

TINY = ["--seq-len", "3", "--n-values", "4", "--n-train", "64", "--n-eval", "32", "--d-model", "16",
        "--d-mlp", "16", "--n-layers", "1", "--n-heads", "2", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny finished run (2 epochs) and the input files the cases point at."""
    root = tmp_path_factory.mktemp("cli_errors")
    run = root / "run"
    assert main(["train", *TINY, "--epochs", "2", "--eval-every", "1", "--run-dir", str(run)]) == 0
    inputs = root / "inputs"
    inputs.mkdir()
    (inputs / "truncated.json").write_text('{"task": {"seq_len": 3, ')
    (inputs / "latin1.json").write_bytes(b'{"task": {"task": "caf\xe9"}}')
    (inputs / "malformed.yaml").write_text("task: {seq_len: 3\nmodel: [unclosed\n")
    (inputs / "list.json").write_text("[1, 2, 3]")
    (inputs / "a_dir.json").mkdir()
    for name, data in {
        "unknown_section.json": {"tasks": {}},
        "old_task_layout.json": {"task": {"task": "max_parity_sum_parity", "seq_len": 3}},
        "old_device_layout.json": {"device": "cpu", "train": {"epochs": 2}},
        "unknown_train_key.json": {"train": {"epochz": 3}},
        "unknown_model_key.json": {"model": {"n_layerz": 1}},
        "unknown_task_key.json": {"task": {"seq_lenn": 3}},
        "train_seed_null.json": {"train": {"seed": None}},
        "model_seed_null.json": {"model": {"seed": None}},
        "task_seed_null.json": {"task": {"seed": None}},
        "epochs_string.json": {"train": {"epochs": "ten"}},
        "section_not_mapping.json": {"train": 5},
        "sweep_unknown_key.json": {"ratioz": [0.5]},
        "task_bigger_vocab.json": {"seq_len": 3, "n_values": 9, "n_train": 64, "n_eval": 32},
    }.items():
        (inputs / name).write_text(json.dumps(data))
    (inputs / "sweep_malformed.yaml").write_text("ratios: [0.5, 0.9\n")
    (inputs / "duplicate_key.json").write_text('{"train": {"lr": 0.001, "lr": 0.002}}')
    (inputs / "duplicate_key.yaml").write_text("train:\n  lr: 1e-3\n  epochs: 2\n  lr: 2e-3\n")
    (inputs / "sweep_duplicate_key.yaml").write_text("ratios: [0.5]\nratios: [0.9]\n")
    (inputs / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    import pickle

    (inputs / "pickle.safetensors").write_bytes(pickle.dumps({"embed.weight": [0.0]}, protocol=4))
    user_folder = root / "user_folder"
    user_folder.mkdir()
    (user_folder / "notes.txt").write_text("my own notes")
    header = ("task,n_layers,n_heads,weight_decay,r,seed,status,generalized,first_generalized_epoch,rule_learned,"
              "first_rule_learned_epoch,transient,max_adv_acc,max_val_acc,final_adv_acc,final_val_acc,"
              "shortcut_epoch,final_epoch,run_dir")
    row = "max_parity_sum_parity,1,2,0.1,{r},{seed},finished,True,10,True,10,False,1.0,1.0,1.0,1.0,5,20,{run}"
    good = [row.format(r=r, seed=s, run=f"runs/r{r}_s{s}") for r in (0.5, 0.9) for s in (0, 1)]
    (inputs / "outcomes.csv").write_text("\n".join([header, *good]) + "\n")
    (inputs / "outcomes_task.csv").write_text("\n".join([header, *good[:3],
                                                        "=HYPERLINK(1)" + good[3][len("max_parity_sum_parity"):]])
                                             + "\n")
    (inputs / "outcomes_formula.csv").write_text("\n".join([header, *good[:3], good[3].replace("runs/", "=cmd|")])
                                                + "\n")
    (inputs / "corpus_truncated.json").write_text('{"vocab_size": ')
    (inputs / "garbage.safetensors").write_bytes(b"not a checkpoint at all")
    (inputs / "a_file").write_text("x")
    (inputs / "no_record").mkdir()
    (inputs / "bad_record").mkdir()
    (inputs / "bad_record" / "run.json").write_text('{"key": "abc", "status": ')
    checkpoint = sorted((run / "checkpoints").glob("*.safetensors"))[-1]
    return {"root": root, "run": run, "inputs": inputs, "checkpoint": checkpoint}


def _train(*extra):
    return lambda p: ["train", *TINY, "--epochs", "2", "--run-dir", str(p["work"] / "new_run"), *extra]


def _config(name):  # no --epochs flag: it would override the file's value
    return lambda p: ["train", "--quiet", "--run-dir", str(p["work"] / "new_run"), "--config", "{inputs}/" + name]


def _sweep(*extra):
    return lambda p: ["sweep", "--preset", "smoke", "--quiet", "--workers", "1", "--out", str(p["work"] / "study"),
                      *extra]


def _analyze(analysis, *extra):
    return lambda p: ["analyze", str(p["run"]), "--analysis", analysis, "--no-progress", "--no-plot", *extra]


def _bif(*extra, checkpoint="{checkpoint}"):
    return lambda p: [
        "bif", checkpoint, "--out", str(p["work"] / "bif"), "--no-progress", "--no-adaptive", "--draws", "2",
        "--burn-in", "1", "--chains", "2", *extra,
    ]


# (id, argv builder, fragments the single error line must contain). "{inputs}" etc. are filled in.
CASES = [
    # train: numbers and choices of every option class
    ("train-epochs-0", _train("--epochs", "0"), ["epochs", "0"]),
    ("train-epochs-text", _train("--epochs", "abc"), ["--epochs", "'abc'"]),
    ("train-lr-negative", _train("--lr", "-1"), ["lr", "-1"]),
    ("train-lr-nan", _train("--lr", "nan"), ["lr", "nan"]),
    ("train-weight-decay-negative", _train("--weight-decay", "-0.5"), ["weight_decay", "-0.5"]),
    ("train-batch-size-0", _train("--batch-size", "0"), ["batch_size", "0"]),
    ("train-eval-every-0", _train("--eval-every", "0"), ["eval_every", "0"]),
    ("train-checkpoint-every-negative", _train("--checkpoint-every", "-3"), ["checkpoint_every", "-3"]),
    ("train-model-init-unknown", _train("--model.init", "xavier"), ["ModelConfig.init", "'xavier'"]),
    ("train-model-init-scale-0", _train("--model.init-scale", "0"), ["ModelConfig.init_scale", "0"]),
    ("train-extreme-train-too-many", _train("--task.extreme-train", "99999"), ["extreme_train", "99999"]),
    ("train-r-above-1", _train("--r", "1.5"), ["r", "1.5"]),
    ("train-r-text", _train("--r", "abc"), ["--r", "'abc'"]),
    ("train-seq-len-0", _train("--seq-len", "0"), ["seq_len", "0"]),
    ("train-n-values-1", _train("--n-values", "1"), ["n_values", "1"]),
    ("train-n-train-0", _train("--n-train", "0"), ["n_train", "0"]),
    ("train-n-eval-negative", _train("--n-eval", "-1"), ["n_eval", "-1"]),
    ("train-n-layers-0", _train("--n-layers", "0"), ["n_layers", "0"]),
    ("train-n-heads-0", _train("--n-heads", "0"), ["n_heads", "0"]),
    ("train-d-mlp-0", _train("--d-mlp", "0"), ["d_mlp", "0"]),
    ("train-task-unknown", _train("--task", "nonsense"), ["--task", "'nonsense'"]),
    ("train-data-seed-text", _train("--data-seed", "x1"), ["--data-seed", "'x1'"]),
    ("train-device-unknown", _train("--device", "banana"), ["device", "banana"]),
    (
        "train-run-dir-is-file", lambda p: ["train", *TINY, "--epochs", "2", "--run-dir", str(p["inputs"] / "a_file")],
        ["a_file", "not a directory"],
    ),
    # train: config files
    ("config-missing", _config("missing.json"), ["missing.json", "does not exist"]),
    ("config-is-directory", _config("a_dir.json"), ["a_dir.json", "directory"]),
    ("config-truncated-json", _config("truncated.json"), ["truncated.json", "not valid JSON"]),
    ("config-not-utf8", _config("latin1.json"), ["latin1.json", "UTF-8"]),
    ("config-malformed-yaml", _config("malformed.yaml"), ["malformed.yaml", "not valid YAML"]),
    ("config-not-a-mapping", _config("list.json"), ["list.json", "mapping"]),
    ("config-unknown-section", _config("unknown_section.json"), ["unknown_section.json", "tasks"]),
    ("config-unknown-train-key", _config("unknown_train_key.json"), ["epochz"]),
    # layouts of earlier versions: the task name inside the task section, a top-level device
    ("config-old-task-layout", _config("old_task_layout.json"), ["old_task_layout.json", "['task']"]),
    ("config-old-device-layout", _config("old_device_layout.json"), ["old_device_layout.json", "['device']"]),
    ("config-unknown-model-key", _config("unknown_model_key.json"), ["n_layerz"]),
    ("config-unknown-task-key", _config("unknown_task_key.json"), ["seq_lenn"]),
    ("config-train-seed-none", _config("train_seed_null.json"), ["seed", "None"]),
    ("config-model-seed-none", _config("model_seed_null.json"), ["seed", "None"]),
    ("config-task-seed-none", _config("task_seed_null.json"), ["seed", "None"]),
    ("config-epochs-string", _config("epochs_string.json"), ["epochs", "'ten'"]),
    ("config-section-not-mapping", _config("section_not_mapping.json"), ["train", "5"]),
    # sweep
    ("sweep-workers-0", _sweep("--workers", "0"), ["workers", "0"]),
    ("sweep-log-every-0", _sweep("--log-every", "0"), ["log_every", "0", "positive number of seconds"]),
    ("sweep-ratio-text", _sweep("--ratios", "0.5,abc"), ["--ratios", "abc"]),
    ("sweep-ratio-above-1", _sweep("--ratios", "1.5"), ["1.5"]),
    ("sweep-seeds-0", _sweep("--seeds", "0"), ["seeds", "0"]),
    ("sweep-seeds-text", _sweep("--seeds", "a,b"), ["--seeds", "'a'"]),
    ("sweep-layers-0", _sweep("--layers", "0"), ["n_layers", "0"]),
    ("sweep-task-unknown", _sweep("--tasks", "nonsense"), ["nonsense"]),
    ("sweep-backend-unknown", _sweep("--backend", "nope"), ["--backend", "'nope'"]),
    ("sweep-preset-unknown", lambda p: ["sweep", "--preset", "huge"], ["preset", "'huge'"]),
    ("sweep-epochs-0", _sweep("--epochs", "0"), ["epochs", "0"]),
    ("sweep-config-missing", _sweep("--config", "{inputs}/missing.yaml"), ["missing.yaml", "does not exist"]),
    (
        "sweep-config-malformed-yaml", _sweep("--config", "{inputs}/sweep_malformed.yaml"),
        ["sweep_malformed.yaml", "YAML"],
    ),
    ("sweep-config-unknown-key", _sweep("--config", "{inputs}/sweep_unknown_key.json"), ["ratioz"]),
    (
        "sweep-out-is-file", lambda p: ["sweep", "--preset", "smoke", "--quiet", "--out", str(p["inputs"] / "a_file")],
        ["a_file", "not a directory"],
    ),
    # analyze
    (
        "analyze-run-dir-missing", lambda p: ["analyze", str(p["work"] / "nowhere"), "--analysis", "fingerprints"],
        ["nowhere"],
    ),
    (
        "analyze-run-dir-is-file", lambda p: ["analyze", str(p["inputs"] / "a_file"), "--analysis", "fingerprints"],
        ["a_file"],
    ),
    ("analyze-analysis-unknown", _analyze("nope"), ["--analysis", "'nope'"]),
    ("analyze-epoch-missing", _analyze("fingerprints", "--epochs", "999"), ["999"]),
    ("analyze-n-0", _analyze("fingerprints", "--n", "0"), ["n", "0"]),
    (
        "analyze-patching-source-is-target", _analyze("patching", "--source", "val", "--target", "val"),
        ["source and target", "'val'"],
    ),
    ("analyze-split-unknown", _analyze("fingerprints", "--split", "nope"), ["'nope'"]),
    ("analyze-option-out-of-scope", _analyze("fingerprints", "--method", "zero"), ["--method", "fingerprints"]),
    ("analyze-component-unknown", _analyze("ablation", "--components", "L9H9"), ["L9H9"]),
    ("analyze-last-and-epochs", _analyze("fingerprints", "--last", "--epochs", "0"), ["--last", "--epochs"]),
    # info
    ("info-missing", lambda p: ["info", str(p["work"] / "missing.safetensors")], ["missing.safetensors"]),
    ("info-garbage", lambda p: ["info", str(p["inputs"] / "garbage.safetensors")], ["garbage.safetensors"]),
    ("info-dir-without-record", lambda p: ["info", str(p["inputs"] / "no_record")], ["no_record", "run.json"]),
    (
        "info-truncated-record", lambda p: ["info", str(p["inputs"] / "bad_record")],
        ["bad_record/run.json", "not a readable run record"],
    ),
    (
        "train-truncated-record",
        lambda p: ["train", *TINY, "--epochs", "2", "--run-dir", str(p["inputs"] / "bad_record")],
        ["bad_record/run.json", "not a readable run record"],
    ),
    # bif
    ("bif-checkpoint-missing", _bif(checkpoint="{work}/missing.safetensors"), ["missing.safetensors"]),
    ("bif-checkpoint-is-directory", _bif(checkpoint="{inputs}/no_record"), ["no_record"]),
    ("bif-n-attribution-0", _bif("--n-attribution", "0"), ["n_attribution", "0"]),
    ("bif-eps-negative", _bif("--eps", "-1"), ["eps", "-1"]),
    ("bif-chains-0", _bif("--chains", "0"), ["chains", "0"]),
    # a section field nested and by its short name, and a spelling that is gone, through main
    ("bif-sampler-eps-text", _bif("--sampler.eps", "lots"), ["--sampler.eps", "lots"]),
    ("bif-short-seed-text", _bif("--seed", "x1"), ["--seed", "x1"]),
    ("sweep-train-seed-text", _sweep("--train.seed", "x1"), ["--train.seed", "x1"]),
    ("sweep-old-dashed-spelling", _sweep("--train-seed", "3"), ["--train-seed"]),
    ("bif-query-split-unknown", _bif("--query-split", "test"), ["--query-split", "'test'"]),
    ("bif-task-config-truncated", _bif("--task-config", "{inputs}/truncated.json"), ["truncated.json", "JSON"]),
    (
        "bif-token-ids-outside-vocab",
        _bif("--task-config", "{inputs}/task_bigger_vocab.json"),
        # the run record catches the other data before the vocabulary check would
        ["other data", "n_values"],
    ),
    # bif-lm
    (
        "bif-lm-checkpoint-missing",
        lambda p: ["bif-lm", str(p["work"] / "no_such_run"), "--out", str(p["work"] / "o")], ["no_such_run"],
    ),
    (
        "bif-lm-corpus-config-truncated",
        lambda p: [
            "bif-lm", str(p["run"]), "--corpus-config", str(p["inputs"] / "corpus_truncated.json"), "--out",
            str(p["work"] / "o"),
        ],
        ["corpus_truncated.json"],
    ),
    # inputs checked before any work: sizes, infinities, seeds, duplicate keys, folders, file kinds
    ("train-n-train-beyond-memory", _train("--n-train", "99999999999999"), ["n_train 99,999,999,999,999", "GiB"]),
    ("train-weight-decay-inf", _train("--weight-decay", "inf"), ["weight_decay", "finite", "inf"]),
    (
        "train-data-seed-overflow", _train("--data-seed", "99999999999999999999"),
        ["MPSPConfig.seed", "data seed", "99999999999999999999"],
    ),
    ("train-model-seed-negative", _train("--model-seed", "-1"), ["ModelConfig.seed", "-1"]),
    (
        "train-shuffling-seed-beyond-limit", _train("--train.seed", str(2**62)),
        ["TrainConfig.seed", "shuffling seed", str(2**62)],
    ),
    ("config-duplicate-key-json", _config("duplicate_key.json"), ["duplicate_key.json", "'lr' appears twice"]),
    (
        "config-duplicate-key-yaml", _config("duplicate_key.yaml"),
        ["duplicate_key.yaml", "'lr' appears twice", "line 4"],
    ),
    (
        "sweep-config-duplicate-key", _sweep("--config", "{inputs}/sweep_duplicate_key.yaml"),
        ["sweep_duplicate_key.yaml", "'ratios' appears twice"],
    ),
    ("sweep-weight-decay-inf", _sweep("--weight-decays", "inf"), ["weight_decay", "inf"]),
    (
        "train-run-dir-folder-of-user-files",
        lambda p: ["train", *TINY, "--epochs", "2", "--run-dir", str(p["root"] / "user_folder")],
        ["user_folder", "files that are no run's (notes.txt)", "--overwrite"],
    ),
    (
        "train-more-epochs-into-a-finished-run",
        lambda p: ["train", *TINY, "--epochs", "3", "--eval-every", "1", "--run-dir", str(p["run"])],
        ["holds a different run's files", "finished run of 2 epochs", "to 3", "--extend-from"],
    ),
    (
        "analyze-out-dir-is-file", _analyze("weight_norms", "--out-dir", "{inputs}/a_file"),
        ["--out-dir", "a_file", "is a file, not a folder"],
    ),
    (
        "mechanism-out-unknown-suffix",
        lambda p: ["mechanism", str(p["run"]), "--out", str(p["work"] / "x.gif"), "--no-progress"],
        ["--out", "x.gif", ".png, .svg, .pdf"],
    ),
    (
        "influence-min-epoch-beyond-run",
        lambda p: [
            "influence", str(p["run"]), "--min-epoch", "999", "--no-progress", "--out", str(p["work"] / "influence"),
        ],
        ["--min-epoch 999", "its last is epoch 2"],
    ),
    (
        "info-pickle", lambda p: ["info", str(p["inputs"] / "pickle.safetensors")],
        ["pickle.safetensors", "a pickle file", "not safetensors"],
    ),
    (
        "analyze-pickle-checkpoint",
        lambda p: ["analyze", str(p["inputs"] / "pickle.safetensors"), "--analysis", "weight_norms"],
        ["pickle.safetensors"],
    ),
    (
        "bif-param-patterns-unknown", _bif("--param-patterns", "nope*"),
        ["param_patterns", "'nope*'", "embed.weight", "blocks.0.attn"],
    ),
    (
        "bif-lm-same-checkpoint-twice",
        lambda p: ["bif-lm", "{checkpoint}", "{checkpoint}", "--out", str(p["work"] / "o")],
        ["given more than once", "epoch_000002.safetensors"],
    ),
    (
        "bif-lm-text-not-utf8",
        lambda p: [
            "bif-lm", str(p["run"]), "--text", "{inputs}/latin1.txt", "--tokenizer", "{inputs}/no_record", "--out",
            str(p["work"] / "o"),
        ],
        ["latin1.txt", "not UTF-8"],
    ),
    (
        "report-unknown-task", lambda p: ["report", "{inputs}/outcomes_task.csv", "--out", str(p["work"] / "r")],
        ["outcomes_task.csv line 5", "column task", "'=HYPERLINK(1)'"],
    ),
    (
        "report-formula-cell", lambda p: ["report", "{inputs}/outcomes_formula.csv", "--out", str(p["work"] / "r")],
        ["outcomes_formula.csv line 5", "column run_dir", "formula"],
    ),
    (
        "report-compare-cell-with-itself",
        lambda p: ["report", "{inputs}/outcomes.csv", "--out", str(p["work"] / "r"), "--compare", "r=0.9", "r=0.9"],
        ["same cell", "r=0.9"],
    ),
    # demo
    ("demo-epochs-0", lambda p: ["demo", "--epochs", "0", "--out", str(p["work"] / "demo")], ["epochs", "0"]),
    ("demo-n-train-0", lambda p: ["demo", "--n-train", "0", "--out", str(p["work"] / "demo")], ["n_train", "0"]),
]


def _snapshot(*roots: Path) -> dict[str, int]:
    files = {}
    for root in roots:
        for path in root.rglob("*"):
            files[str(path)] = path.stat().st_mtime_ns if path.is_file() else -1
    return files


@pytest.mark.parametrize("builder,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_error_line(trained, tmp_path, monkeypatch, capsys, builder, fragments):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # default output folders (runs/...) land here and are checked too
    paths = {**trained, "work": work}
    argv = [a.format(**{k: str(v) for k, v in paths.items()}) for a in builder(paths)]
    before = _snapshot(trained["root"], work)
    try:
        code = main(argv)
    except SystemExit as err:  # argparse refuses bad choices and types itself (exit 2)
        code = err.code
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    error_lines = [line for line in (out + err).splitlines() if "error:" in line]
    assert len(error_lines) == 1, (out, err)
    for fragment in fragments:
        assert fragment in error_lines[0], (fragment, error_lines[0])
    assert "Traceback" not in out + err
    assert _snapshot(trained["root"], work) == before, "a refused command left or changed a file"


def test_the_table_is_big_enough():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EFBIG", "EACCES"])
def test_disk_full_and_permission_errors_are_one_line(monkeypatch, capsys, errno_name):
    import errno


    def refused(args):
        code = getattr(errno, errno_name)
        raise OSError(code, os.strerror(code), "/data/run/.metrics.jsonl.tmp")

    import interp_toolkit.cli.info as info_command

    monkeypatch.setattr(info_command, "run_config", refused)
    assert main(["info", "anything"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "/data/run/.metrics.jsonl.tmp" in err and "Traceback" not in err


def test_a_bug_exits_1_with_a_log_of_the_traceback(monkeypatch, capsys):

    def broken(args):
        raise ZeroDivisionError("division by zero in a handler")

    import interp_toolkit.cli.info as info_command

    monkeypatch.setattr(info_command, "run_config", broken)
    assert main(["info", "anything"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "ZeroDivisionError" in err
    log = Path(err.rsplit("traceback in ", 1)[1].strip())
    assert "ZeroDivisionError" in log.read_text() and "Traceback" in log.read_text()
    log.unlink()


def test_a_library_value_error_is_a_bug_not_a_user_error(monkeypatch, capsys, tmp_path):
    """A ValueError from inside the library (here a torch shape error in the model's forward,
    reached through a real command) is a bug: exit 1 and a crash log, never 'error:' and 2.
    A UserError from the same place is the user's: exit 2, one line."""
    from interp_toolkit.errors import UserError

    assert not issubclass(UserError, ValueError)
    monkeypatch.setenv("INTERP_TOOLKIT_LOG_DIR", str(tmp_path / "logs"))
    import interp_toolkit.cli.info as info_command

    def shape_bug(args):
        import torch

        torch.zeros(2, 3) @ torch.zeros(2, 3)  # RuntimeError in torch: a bug too
        return 0

    def value_bug(args):
        int("not a number")  # a ValueError the library did not mean for the user
        return 0

    for broken in (shape_bug, value_bug):
        monkeypatch.setattr(info_command, "run_config", broken)
        assert main(["info", "anything"]) == 1
        err = capsys.readouterr().err
        assert "error:" not in err and "internal error" in err, err
        log = Path(err.rsplit("traceback in ", 1)[1].strip())
        assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()

    def refused(args):
        raise UserError("--r must be in [0, 1], got 2.0")

    monkeypatch.setattr(info_command, "run_config", refused)
    assert main(["info", "anything"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --r must be in [0, 1], got 2.0"


def test_a_warning_is_one_line_without_a_source_path(monkeypatch, capsys):
    import warnings

    import interp_toolkit.cli.info as info_command

    def warns(args):
        warnings.warn("BIF not converged:\n  chains disagree", UserWarning, stacklevel=1)
        warnings.warn("an older format", DeprecationWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(info_command, "run_config", warns)
    before = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["info", "anything"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ["warning: BIF not converged: chains disagree",
                                "warning: (DeprecationWarning) an older format"], err
    assert warnings.showwarning is before  # restored once the command returns
