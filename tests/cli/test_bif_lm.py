import csv
import json
import math

import pytest
import torch

from interp_toolkit.cli import main as cli_main
from interp_toolkit.cli.bif_lm import main
from interp_toolkit.errors import UserError
from interp_toolkit.studies.lm.testbed import TestbedConfig, pythia_schedule, train_testbed
from interp_toolkit.tasks.induction_corpus import CorpusConfig

torch.set_num_threads(1)


def test_pythia_schedule():
    steps = pythia_schedule(143000, 1000)
    assert len(steps) == 154 and steps[:11] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and steps[11] == 1000
    assert pythia_schedule(10, 4) == [0, 1, 2, 4, 8, 10]
    with pytest.raises(UserError, match="linear_every"):
        pythia_schedule(10, 0)


def test_testbed_and_cli_end_to_end(tmp_path, capsys):
    corpus = CorpusConfig(n_sequences=64, seq_len=16, n_ordinary=10, chunk_min=3, chunk_max=5)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=2, d_model=16, d_mlp=32, total_steps=4, linear_every=2,
                        batch_size=8, warmup_steps=1)
    refs = train_testbed(cfg, tmp_path / "tb", progress=False)
    assert [r.step for r in refs] == [0, 1, 2, 4]
    assert train_testbed(cfg, tmp_path / "tb", progress=False) == refs  # cache hit
    argv = [str(tmp_path / "tb" / "checkpoints"), "--out", str(tmp_path / "out"), "--n-posterior", "32",
            "--n-train", "4", "--n-query", "3", "--no-adaptive", "--chains", "2", "--draws", "4", "--burn-in", "1",
            "--batch-size", "8", "--eps", "1e-4", "--no-progress"]
    assert main(argv) == 0
    table_text = (tmp_path / "out" / "per_class.csv").read_text()
    table = list(csv.DictReader(table_text.splitlines()))
    assert len(table) > 0 and (tmp_path / "out" / "per_class.png").stat().st_size > 1000
    assert sorted({int(r["step"]) for r in table}) == [0, 1, 2, 4]
    assert {r["reduction"] for r in table} == {"class:class", "class:all", "sequence:sequence"}
    assert all(0.0 <= float(r["induction_score"]) <= 1.0 for r in table)
    # the claim series: one row per (checkpoint, claim), the testbed's seed, a figure each
    from interp_toolkit.studies.lm.claims import CLAIM_CSV_FIELDS, CLAIM_LOCALITY_FIELDS, read_claims_csv

    claims_text = (tmp_path / "out" / "claims.csv").read_text()
    assert claims_text.splitlines()[0] == ",".join(CLAIM_CSV_FIELDS + CLAIM_LOCALITY_FIELDS)
    claims = read_claims_csv(tmp_path / "out" / "claims.csv")
    # every row carries its checkpoint's locality gate, against the posterior's unigram loss
    assert all(math.isfinite(r["climb"]) and r["local"] in (True, False) for r in claims)
    assert {r["verdict"] for r in table} <= {"converged and local", "converged, not local", "not converged"}
    assert all(math.isfinite(float(r["climb"])) for r in table)
    series = {r["series"] for r in claims}
    assert "induction->induction" in series and len(claims) == 4 * len(series)
    assert {r["seed"] for r in claims} == {cfg.seed} and all(r["stderr"] > 0 for r in claims)
    class_class = {(int(r["step"]), r["train_group"], r["query_group"]): float(r["bif"])
                   for r in table if r["reduction"] == "class:class"}
    for r in claims:
        if r["minus"] is None:  # a plain claim is its class:class entry
            assert r["bif"] == pytest.approx(class_class[(r["step"], r["source_class"], r["target_class"])], rel=1e-9)
    figures = sorted(p.name for p in (tmp_path / "out").glob("claim_*.png"))
    assert len(figures) == len(series) and "claim_induction_to_induction.png" in figures
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for entry in summary["checkpoints"]:
        assert entry["sampling_verdict"] == "not converged"  # 2 chains x 4 draws
        assert entry["locality"]["reference"].startswith("unigram") and entry["localization"]["gamma"] >= 100
        assert entry["locality"]["worst_climb"] == pytest.approx(max(entry["locality"]["climb"]))
    stored = [c["result_dir"] for c in summary["checkpoints"]]
    mtimes = [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    assert main(argv) == 0
    assert (tmp_path / "out" / "per_class.csv").read_text() == table_text  # cache hits, same numbers
    assert mtimes == [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    capsys.readouterr()
    assert main([*argv, "--reductions", "class:nope"]) == 2
    err = capsys.readouterr().err
    assert "reductions" in err and err.count("error:") == 1 and "Traceback" not in err
    for bad, words in ((["--claims", "open"], "not a class pair"), (["--claims", "open->nope"], "class 'nope'")):
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("error:") == 1 and "Traceback" not in err
    # --replot redraws the claim figures from the CSV alone
    assert main(["--replot", str(tmp_path / "out" / "claims.csv"), "--out", str(tmp_path / "replot")]) == 0
    assert sorted(p.name for p in (tmp_path / "replot").glob("claim_*.png")) == figures


def _text_model(tmp_path):
    """A tiny GPTNeoX and a WordLevel tokenizer trained on a small text, saved together."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "(", ")", "[", "]", '"']
    halves = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(40)]
    lines = [f"{h} {h}" for h in halves]  # every document repeats itself: induction tokens
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n")
    vocab = {w: i for i, w in enumerate(["[UNK]", "<eos>", *sorted(set(words))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "model" / "step7")
    tokenizer.save_pretrained(tmp_path / "model" / "step7")
    return tmp_path / "model" / "step7", tokenizer


def _rows(out_dir):
    return list(csv.DictReader((out_dir / "per_class.csv").read_text().splitlines()))


def test_cli_token_classes_on_text_from_flags_and_config_file(tmp_path, capsys):
    model_dir, tokenizer = _text_model(tmp_path)
    sampler = [
        "--n-posterior", "12", "--n-train", "3", "--n-query", "3", "--no-adaptive", "--chains", "2", "--draws", "3",
        "--burn-in", "1", "--batch-size", "4", "--eps", "1e-4", "--no-progress",
    ]
    cat = tokenizer.convert_tokens_to_ids("cat")
    assert cli_main(["bif-lm", str(model_dir), "--text", str(tmp_path / "text.txt"), "--seq-len", "16",
                     "--token-class", f"cat={cat}", "--token-class-regex", "canine=dog", "--out", str(tmp_path / "a"),
                     *sampler]) == 0
    rows = _rows(tmp_path / "a")
    groups = {r["train_group"] for r in rows if r["reduction"] == "class:all"}
    assert {"open", "close", "induction", "cat", "canine"} <= groups
    assert {int(r["step"]) for r in rows} == {7}
    config = {"text": str(tmp_path / "text.txt"), "seq_len": 16, "user_classes": {"cat": [cat]},
              "user_class_regex": {"canine": "dog"}}
    (tmp_path / "classes.json").write_text(json.dumps(config))
    assert cli_main(["bif-lm", str(model_dir), "--classes-config", str(tmp_path / "classes.json"),
                     "--out", str(tmp_path / "b"), *sampler]) == 0
    again = _rows(tmp_path / "b")
    assert [(r["train_group"], r["query_group"], r["bif"]) for r in again] == [
        (r["train_group"], r["query_group"], r["bif"]) for r in rows]
    capsys.readouterr()
    (tmp_path / "bad.json").write_text(json.dumps({**config, "seqlen": 3}))
    for argv, message in [
        (["--token-class", "x=1"], "need a text"),
        (["--classes-config", str(tmp_path / "bad.json")], "unknown TextClassesConfig keys"),
        (["--text", str(tmp_path / "text.txt"), "--seq-len", "16", *sampler[:1], "200"], "fewer than n_posterior"),
        (["--text", str(tmp_path / "text.txt"), "--token-class", "cat"], "--token-class 'cat' must be NAME=VALUE"),
        (["--text", str(tmp_path / "text.txt"), "--token-class", "cat=a,b"], "integer ids"),
        (["--pearson-convention", "nope"], "nope"),
    ]:
        code = cli_main(["bif-lm", str(model_dir), "--out", str(tmp_path / "c"), *sampler, *argv])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("error:") == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "c").exists()  # refused before any work


def test_text_flags_override_classes_config_and_repeat(tmp_path):
    from interp_toolkit.cli.bif_lm import parse, text_classes_config

    (tmp_path / "classes.yaml").write_text("text: a.txt\nseq_len: 8\npack: false\nuser_classes: {x: [1]}\n")
    args = parse(["ckpt", "--classes-config", str(tmp_path / "classes.yaml"), "--seq-len", "12", "--no-induction",
                  "--token-class", "y=2,3", "--token-class", "z=4", "--token-class-regex", "w=^a$",
                  "--pearson-convention", "group_means", "--stderr-method", "per_chain"])
    text = text_classes_config(args)
    assert (text.text, text.seq_len, text.pack, text.induction, text.delimiters) == ("a.txt", 12, False, False, True)
    assert text.user_classes == {"x": [1], "y": [2, 3], "z": [4]} and text.user_class_regex == {"w": "^a$"}
    assert (args.pearson_convention, args.stderr_method) == ("group_means", "per_chain")
    assert text_classes_config(parse(["ckpt"])) is None


def test_bif_lm_extends_chains_reports_and_calibrates(tmp_path, capsys):
    """Adaptive by default: every checkpoint's rounds and verdict are in summary.json, its
    result sits at the top of --out (the rounds under rounds/), the figure marks unconverged
    checkpoints; --calibrate sweeps eps on the same posterior."""
    corpus = CorpusConfig(n_sequences=64, seq_len=16, n_ordinary=10, chunk_min=3, chunk_max=5)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=2, d_model=16, d_mlp=32, total_steps=2, linear_every=2,
                        batch_size=8, warmup_steps=1)
    train_testbed(cfg, tmp_path / "tb", progress=False)
    common = [str(tmp_path / "tb" / "checkpoints"), "--n-posterior", "32", "--n-train", "4", "--n-query", "3",
              "--draws", "4", "--burn-in", "2", "--batch-size", "8", "--no-progress"]
    capsys.readouterr()
    assert main([*common, "--out", str(tmp_path / "out"), "--max-steps", "24"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for entry in summary["checkpoints"]:
        rounds = entry["adaptive"]["rounds"]
        assert rounds[0]["steps_per_chain"] == 6
        for before, after in zip(rounds, rounds[1:]):
            if after["steps_per_chain"] == before["steps_per_chain"]:
                # the same length again: a rerun at a third of eps after draws that left the solution
                assert before["local"] is False or before["diverged"]
                assert after["eps"] == pytest.approx(before["eps"] / 3)
            else:  # a longer round: twice the draws and burn-in, at the same eps
                assert after["steps_per_chain"] == 2 * before["steps_per_chain"] and after["eps"] == before["eps"]
        assert rounds[-1]["steps_per_chain"] <= 24
        assert entry["adaptive"]["stopped"] in ("converged", "budget")
        assert entry["verdict"].startswith("converged" if entry["adaptive"]["converged"] else "NOT converged")
        result = tmp_path / "out" / entry["result_dir"].split("/")[-1]
        assert (result / "lm_bif.safetensors").is_file()
    assert list((tmp_path / "out" / "rounds").glob("lm_bif_*"))
    assert "note: BIF at" in capsys.readouterr().err
    # the defaults themselves: 4 chains (R-hat needs several), adaptive, a stated budget
    from interp_toolkit.cli.bif_lm import parse

    defaults = parse([str(tmp_path / "tb" / "checkpoints")])
    assert defaults.sampler.chains >= 4 and defaults.convergence.adaptive and defaults.convergence.max_steps > 0
    assert main([*common, "--out", str(tmp_path / "cal"), "--calibrate", "--calibrate-eps", "1e-4", "1e-3"]) == 0
    printed = capsys.readouterr().out
    (calibration,) = (tmp_path / "cal").glob("calibration_*.json")
    assert [row["eps"] for row in json.loads(calibration.read_text())["rows"]] == [1e-4, 1e-3]
    assert "recommended:" in printed and calibration.with_suffix(".png").is_file()


def test_per_class_figure_marks_unconverged_checkpoints():
    from interp_toolkit.studies.lm.series import plot_per_class

    rows = [
        {
            "step": s, "checkpoint": str(s), "induction_score": 0.1, "reduction": "class:all", "train_group": g,
            "query_group": "all", "bif": 0.01 * s, "stderr": 0.001,
        }
        for s in (0, 1, 2)
        for g in ("induction", "random")
    ]
    fig = plot_per_class(rows, converged={0: True, 1: False, 2: True})
    hollow = [line for line in fig.axes[0].lines if line.get_markerfacecolor() == "white" and len(line.get_xdata())]
    assert sorted({float(x) for line in hollow for x in line.get_xdata()}) == [1.0]
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "not converged (R-hat > 1.01 or ESS < 100)" in labels
    fig = plot_per_class(rows, converged={0: True, 1: True, 2: True})
    assert "not converged (R-hat > 1.01 or ESS < 100)" not in [line.get_label() for line in fig.axes[0].lines]
