"""A user's task factory, hardened like the training loop: bad output, misbehaving code and a
factory that moved each end in one ``error:`` line (exit 2) that names the factory and the bad
value, before anything is written; its prints reach the user and its helpers import."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from interp_toolkit.cli import main

GOOD = """
    import torch
    from types import SimpleNamespace

    def _split(seed, n=64):
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 5, (n, 4), generator=g)
        labels = tokens.sum(1) % 2
        return SimpleNamespace(tokens=tokens, labels=labels, agrees=(tokens[:, 0] % 2) == labels)
"""

#: name -> (body of make(), words the error must hold)
BAD = {
    "no positions": ("s = _split(0); s.tokens = s.tokens[:, :0]; return {'train': s}",
                     ["'train'", "(64, 0)", "no positions"]),
    "complex tokens": ("s = _split(0); s.tokens = s.tokens.to(torch.complex64); return {'train': s}",
                       ["'train'", ".tokens", "torch.complex64", "torch.int64"]),
    "int8 tokens": ("s = _split(0); s.tokens = s.tokens.to(torch.int8); return {'train': s}",
                    [".tokens", "torch.int8", ".long()"]),
    "uint8 labels": ("s = _split(0); s.labels = s.labels.to(torch.uint8); return {'train': s}",
                     [".labels", "torch.uint8"]),
    "meta tokens": ("s = _split(0); s.tokens = s.tokens.to('meta'); return {'train': s}",
                    [".tokens", "device meta", "CPU"]),
    "a non-string split name": ("return {'train': _split(0), 1: _split(1)}", ["split names [1]", "strings"]),
    "int agrees": ("s = _split(0); s.agrees = s.agrees.long(); return {'train': s}",
                   [".agrees", "torch.int64", "bool"]),
    "default dtype": ("torch.set_default_dtype(torch.float64); return {'train': _split(0)}",
                      ["default dtype", "torch.float64", "torch.float32"]),
    "os.chdir": ("import os; os.chdir('/'); return {'train': _split(0)}", ["working folder", "os.chdir"]),
    "sys.exit(0)": ("import sys; sys.exit(0)", ["sys.exit(0)", "return its splits"]),
    "sys.exit(3)": ("import sys; sys.exit(3)", ["sys.exit(3)"]),
    "an exception": ("raise RuntimeError('the data file is gone\\nsecond line: /data/x.csv')",
                     ["failed while building its splits", "RuntimeError", "second line: /data/x.csv"]),
}


def _write(folder: Path, body: str, header: str = GOOD) -> Path:
    path = folder / "factory.py"
    path.write_text(textwrap.dedent(header) + "\n\ndef make():\n    " + body + "\n")
    return path


def _train(capsys, spec: str, run_dir: Path, *extra: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["train", "--task-factory", spec, "--model.n-layers", "1", "--model.d-model", "16",
                 "--model.d-mlp", "32", "--train.epochs", "2", "--train.eval-every", "1", "--train.no-progress",
                 "--run-dir", str(run_dir), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_factory_is_one_error_naming_it_and_nothing_is_written(case, tmp_path, capsys):
    body, words = BAD[case]
    path = _write(tmp_path, body)
    cwd, dtype = os.getcwd(), torch.get_default_dtype()
    code, out, err = _train(capsys, f"{path}:make", tmp_path / "run")
    assert code == 2, (case, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert f"task factory '{path}:make'" in lines[0], lines[0]
    for word in words:
        assert word in lines[0], (case, word, lines[0])
    assert "internal error" not in err and "invalid arguments" not in err
    assert not (tmp_path / "run").exists()  # refused before anything is written
    assert (os.getcwd(), torch.get_default_dtype()) == (cwd, dtype)  # restored


@pytest.mark.parametrize("header, named", [
    ("def broken(:\n    pass", ["importing", "SyntaxError", "factory.py, line"]),
    ("import a_module_that_is_not_there", ["importing", "ModuleNotFoundError", "a_module_that_is_not_there"]),
])
def test_a_factory_file_that_does_not_import_is_named(header, named, tmp_path, capsys):
    path = _write(tmp_path, "return {}", header=header)
    code, out, err = _train(capsys, f"{path}:make", tmp_path / "run")
    assert code == 2, err
    assert err.startswith(f"error: task factory '{path}:make'"), err
    for word in named:
        assert word in err, (word, err)
    assert not (tmp_path / "run").exists()


def test_a_factorys_prints_and_warnings_reach_the_user_and_its_helpers_import(tmp_path, capsys):
    (tmp_path / "my_helpers.py").write_text(textwrap.dedent(GOOD))
    path = tmp_path / "factory.py"
    path.write_text(textwrap.dedent("""
        import warnings
        from my_helpers import _split  # a module beside the factory file

        def make():
            print("factory: building 3 splits")
            warnings.warn("factory: a small training set")
            return {"train": _split(0), "val": _split(1), "adv": _split(2)}
    """))
    code, out, err = _train(capsys, f"{path}:make", tmp_path / "run")
    assert code == 0, err
    assert "factory: building 3 splits" in out
    assert "factory: a small training set" in err
    assert (tmp_path / "run" / "run.json").is_file()


def test_a_factory_that_moved_is_named_when_its_run_is_analysed(tmp_path, capsys):
    folder = tmp_path / "code"
    folder.mkdir()
    path = _write(folder, "return {'train': _split(0), 'val': _split(1), 'adv': _split(2)}")
    run_dir = tmp_path / "run"
    code, _, err = _train(capsys, f"{path}:make", run_dir)
    assert code == 0, err
    shutil.move(str(folder), str(tmp_path / "moved"))
    capsys.readouterr()
    code = main(["analyze", str(run_dir), "--analysis", "gradients", "--n", "16", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and str(path) in err and "does not exist" in err, err
    assert "internal error" not in err


def test_mechanism_without_minimal_pairs_skips_patching_up_front(tmp_path, capsys):
    """A task with .agrees but no minimal pairs gets its mechanism figure, the patching panel
    marked as not measured, and one note line said before any work (not an error after it)."""

    header = GOOD + """
    def _read(split):  # the readout token 5 last, as the fingerprints expect
        split.tokens = torch.cat([split.tokens, torch.full((len(split.labels), 1), 5)], 1)
        return split
    """
    path = _write(tmp_path, textwrap.dedent("""
        train, val, adv = _read(_split(0, 128)), _read(_split(1)), _read(_split(2))
        val.labels, adv.labels = (val.tokens[:, 0] % 2), 1 - (adv.tokens[:, 0] % 2)  # all agree / none agrees
        val.agrees, adv.agrees = torch.ones(64, dtype=torch.bool), torch.zeros(64, dtype=torch.bool)
        return {'train': train, 'val': val, 'adv': adv}
    """).replace("\n", "\n    "), header=header)
    run_dir = tmp_path / "run"
    code, _, err = _train(capsys, f"{path}:make", run_dir)
    assert code == 0, err
    code = main(["mechanism", str(run_dir), "--grad-n", "32", "--fingerprint-n", "32", "--ablation-n", "32"])
    err = capsys.readouterr().err
    assert code == 0, err
    notes = [line for line in err.splitlines() if "patching" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "minimal_pairs" in notes[0], err
    assert "error" not in err
    import csv

    with open(run_dir / "mechanism.csv", newline="") as handle:
        quantities = {row["quantity"] for row in csv.DictReader(handle)}
    assert {"grad_cos", "qk_rho", "ablation_acc_adv"} <= quantities  # the other panels were measured
    assert not any(q.startswith("patch") for q in quantities)
    assert (run_dir / "mechanism.png").is_file()
