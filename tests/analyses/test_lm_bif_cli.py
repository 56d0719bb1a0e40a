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


def test_testbed_and_cli_end_to_end(tmp_path):
    corpus = CorpusConfig(n_sequences=64, seq_len=16, n_ordinary=10, chunk_min=3, chunk_max=5)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=2, d_model=16, d_mlp=32, total_steps=4, linear_every=2,
                        batch_size=8, warmup_steps=1)
    refs = train_testbed(cfg, tmp_path / "tb", progress=False)
    assert [r.step for r in refs] == [0, 1, 2, 4]
    assert train_testbed(cfg, tmp_path / "tb", progress=False) == refs  # cache hit
    argv = [str(tmp_path / "tb" / "checkpoints"), "--out", str(tmp_path / "out"), "--n-posterior", "32",
            "--n-train", "4", "--n-query", "3", "--chains", "2", "--draws", "4", "--burn-in", "1",
            "--batch-size", "8", "--eps", "1e-4", "--no-progress"]
    rows = main(argv)
    table = list(csv.DictReader(open(tmp_path / "out" / "per_class.csv")))
    assert len(table) == len(rows) > 0 and (tmp_path / "out" / "per_class.png").stat().st_size > 1000
    assert sorted({int(r["step"]) for r in table}) == [0, 1, 2, 4]
    assert {r["reduction"] for r in table} == {"class:class", "class:all", "sequence:sequence"}
    assert all(0.0 <= float(r["induction_score"]) <= 1.0 for r in table)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    stored = [c["result_dir"] for c in summary["checkpoints"]]
    mtimes = [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    assert main(argv) == rows  # rerun: every checkpoint is a cache hit, same numbers
    assert mtimes == [(tmp_path / "out" / d.split("/")[-1] / "lm_bif.safetensors").stat().st_mtime_ns for d in stored]
    with pytest.raises(ValueError, match="reductions"):
        main([*argv, "--reductions", "class:nope"])


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


def test_cli_token_classes_on_text_from_flags_and_config_file(tmp_path):
    model_dir, tokenizer = _text_model(tmp_path)
    sampler = ["--n-posterior", "12", "--n-train", "3", "--n-query", "3", "--chains", "2", "--draws", "3",
               "--burn-in", "1", "--batch-size", "4", "--eps", "1e-4", "--no-progress"]
    cat = tokenizer.convert_tokens_to_ids("cat")
    rows = main([str(model_dir), "--text", str(tmp_path / "text.txt"), "--seq-len", "16", "--token-class",
                 f"cat={cat}", "--token-class-regex", "canine=dog", "--out", str(tmp_path / "a"), *sampler])
    groups = {r["train_group"] for r in rows if r["reduction"] == "class:all"}
    assert {"open", "close", "induction", "cat", "canine"} <= groups
    assert {int(r["step"]) for r in rows} == {7}
    config = {"text": str(tmp_path / "text.txt"), "seq_len": 16, "user_classes": {"cat": [cat]},
              "user_class_regex": {"canine": "dog"}}
    (tmp_path / "classes.json").write_text(json.dumps(config))
    again = main([str(model_dir), "--classes-config", str(tmp_path / "classes.json"), "--out", str(tmp_path / "b"),
                  *sampler])
    assert [(r["train_group"], r["query_group"], r["bif"]) for r in again] == [
        (r["train_group"], r["query_group"], r["bif"]) for r in rows]
    with pytest.raises(ValueError, match="need a text"):
        main([str(model_dir), "--token-class", "x=1", "--out", str(tmp_path / "c"), *sampler])
    with pytest.raises(ValueError, match="unknown TextClassesConfig keys"):
        (tmp_path / "bad.json").write_text(json.dumps({**config, "seqlen": 3}))
        main([str(model_dir), "--classes-config", str(tmp_path / "bad.json"), "--out", str(tmp_path / "c"), *sampler])
    with pytest.raises(ValueError, match="fewer than n_posterior"):
        main([str(model_dir), "--text", str(tmp_path / "text.txt"), "--seq-len", "16", "--out", str(tmp_path / "c"),
              *sampler[:1], "200", *sampler[2:]])


def test_induction_phases_and_testbed_plot():
    from matplotlib.figure import Figure

    from interp_toolkit.studies.lm_testbed import induction_phases, plot_testbed_bif

    steps = [0, 100, 200, 300, 400, 500, 600]
    scores = [0.03, 0.03, 0.05, 0.40, 0.75, 0.80, 0.81]
    phases = induction_phases(steps, scores)
    assert phases["formation_step"] == 300 and phases["max_slope"] == pytest.approx(0.35 / 100)
    assert (phases["start"], phases["end"]) == (300, 400)  # 10% of the 0.78 rise reached at 300, 90% at 400
    with pytest.raises(ValueError, match="increasing"):
        induction_phases([0, 0], [0.1, 0.2])
    rows = [{"step": s, "induction_score": v, "reduction": "class:all", "train_group": c, "query_group": "all",
             "bif": str(0.01 * i * v), "stderr": "0.001"} for s, v in zip(steps, scores)
            for i, c in enumerate(["bos", "random", "induction"])]
    fig = plot_testbed_bif(rows)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["train random tokens", "train induction tokens"]
    assert any("formation" in t.get_text() and "300" in t.get_text() for t in ax.get_legend().get_texts())
    assert {t.get_text() for t in ax.texts} == {"before", "during", "after"}
    assert fig.axes[1].get_ylabel().startswith("induction score")
    other = Figure()
    target = other.add_subplot()
    assert plot_testbed_bif(rows, ax=target) is other
