"""Calibration of the LM testbed: induction score over training steps for candidate configs.

Trains the testbed's tiny GPTNeoX (:func:`interp_toolkit.studies.lm.testbed.testbed_model`)
on the induction/delimiter corpus with the testbed's optimizer and schedule
(:func:`interp_toolkit.studies.lm.testbed.testbed_training_steps`), and prints one
JSON line every ``--eval-every`` steps: step, training loss, induction score (max over heads
of the prefix-matching attention on repeated random tokens, as in
:mod:`interp_toolkit.analyses.induction`, computed here from the HF model's eager attention)
and seconds per step. Used to choose the defaults of ``examples/lm_bif_testbed.py``::

    nice python benchmarks/calibrate_lm_testbed.py --set lr=3e-3 corpus.n_ordinary=64 --steps 3000
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def probe_score(model, probe: torch.Tensor, half: int) -> float:
    with torch.no_grad():
        out = model(probe, output_attentions=True)
    dest = torch.arange(1 + half, 1 + 2 * half)
    src = dest - half + 1
    return max(float(att[:, :, dest, src].mean(dim=(0, 2)).max()) for att in out.attentions)


def main() -> None:
    from interp_toolkit.studies.lm.testbed import (
        TestbedConfig,
        testbed_model,
        testbed_training_steps,
    )
    from interp_toolkit.tasks.induction_corpus import CorpusConfig, repeated_random_tokens

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", nargs="*", default=[], help="KEY=VALUE overrides of TestbedConfig (corpus.KEY too)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = {"total_steps": args.steps, "linear_every": 100, "batch_size": 64, "lr": 1e-3}
    corpus = {"n_sequences": 2048, "seq_len": 48, "n_ordinary": 24, "chunk_min": 10, "chunk_max": 20}
    for item in args.set:
        key, _, value = item.partition("=")
        value = json.loads(value) if value[:1] in "0123456789-[{tf" and value not in ("") else value
        if key.startswith("corpus."):
            corpus[key[7:]] = value
        else:
            base[key] = value
    config = TestbedConfig(corpus=CorpusConfig(**corpus), **base)
    model = testbed_model(config, attn_implementation="eager")  # attention weights for the probe
    c = config.corpus
    half = (c.seq_len - 1) // 2
    probe = repeated_random_tokens(32, half, c.first_ordinary, c.vocab_size, seed=c.seed + 77)
    print(json.dumps({"config": config.to_dict()}), flush=True)
    start = time.perf_counter()
    for step, loss in testbed_training_steps(config, model):
        if step % args.eval_every == 0 or step == config.total_steps:
            model.eval()
            score = probe_score(model, probe, half)
            print(json.dumps({"step": step, "loss": loss, "induction": round(score, 4),
                              "s_per_step": (time.perf_counter() - start) / max(step, 1)}), flush=True)


if __name__ == "__main__":
    main()
