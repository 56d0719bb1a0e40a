import csv
import json

import pytest
import torch

from interp_toolkit.cli.bif_lm import main
from interp_toolkit.studies.lm_testbed import TestbedConfig, pythia_schedule, train_testbed
from interp_toolkit.tasks.induction_corpus import CorpusConfig

torch.set_num_threads(1)


def test_pythia_schedule():
    steps = pythia_schedule(143000, 1000)
    assert len(steps) == 154 and steps[:11] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and steps[11] == 1000
    assert pythia_schedule(10, 4) == [0, 1, 2, 4, 8, 10]
    with pytest.raises(ValueError, match="linear_every"):
        pythia_schedule(10, 0)


def test_testbed_and_cli_end_to_end(tmp_path, capsys):
    corpus = CorpusConfig(n_sequences=64, seq_len=16, n_ordinary=10, chunk_min=3, chunk_max=5)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=2, d_model=16, d_mlp=32, total_steps=4, linear_every=2,
                        batch_size=8, warmup_steps=1)
    refs = train_testbed(cfg, tmp_path / "tb", progress=False)
    assert [r.step for r in refs] == [0, 1, 2, 4]
    assert train_testbed(cfg, tmp_path / "tb", progress=False) == refs  # cache hit
    argv = [str(tmp_path / "tb" / "checkpoints"), "--out", str(tmp_path / "out"), "--n-posterior", "32",
            "--n-train", "4", "--n-query", "3", "--chains", "2", "--draws", "4", "--burn-in", "1",
            "--batch-size", "8", "--eps", "1e-4", "--no-progress"]
    assert main(argv) == 0
    table_text = (tmp_path / "out" / "per_class.csv").read_text()
    table = list(csv.DictReader(table_text.splitlines()))
    assert len(table) > 0 and (tmp_path / "out" / "per_class.png").stat().st_size > 1000
    assert sorted({int(r["step"]) for r in table}) == [0, 1, 2, 4]
    assert {r["reduction"] for r in table} == {"class:class", "class:all", "sequence:sequence"}
    assert all(0.0 <= float(r["induction_score"]) <= 1.0 for r in table)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    stored = [c["result_dir"] for c in summary["checkpoints"]]
    mtimes = [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    assert main(argv) == 0
    assert (tmp_path / "out" / "per_class.csv").read_text() == table_text  # cache hits, same numbers
    assert mtimes == [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    capsys.readouterr()
    assert main([*argv, "--reductions", "class:nope"]) == 2
    err = capsys.readouterr().err
    assert "reductions" in err and err.count("error:") == 1 and "Traceback" not in err
