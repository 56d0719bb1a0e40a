"""End-to-end LM testbed: train a tiny GPTNeoX on the induction/delimiter corpus with
Pythia's checkpoint schedule, then token-level BIF per token class at every checkpoint,
with the induction-head score on the same time axis.

    python examples/lm_bif_testbed.py                 # ~30-45 min on a busy 2-core CPU
    python examples/lm_bif_testbed.py --quick         # ~1 min smoke run

Everything is cached by config hash under ``--out`` (a rerun only redoes what changed).
Outputs: ``<out>/testbed/checkpoints/step*/`` (HF directories), ``<out>/bif/per_class.csv``,
``<out>/bif/per_class.png``, ``<out>/bif/summary.json``, ``<out>/testbed_bif.png`` (the
per-class BIF with the induction transition's before / during / after bands and formation
step, :func:`~interp_toolkit.studies.lm.testbed.plot_testbed_bif`; ``docs/lm_bif_testbed.png``)
and ``<out>/note.txt`` (a short reading of the figure computed from the table).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch

from interp_toolkit.analyses.bif import AdaptiveConfig, SamplerConfig
from interp_toolkit.analyses.bif.lm import LMBIFConfig
from interp_toolkit.analyses.induction import induction_score
from interp_toolkit.io import atomic_write_text
from interp_toolkit.plotting import save_figure
from interp_toolkit.studies.lm.series import bif_over_checkpoints
from interp_toolkit.studies.lm.testbed import (
    TestbedConfig,
    induction_phases,
    plot_testbed_bif,
    train_testbed,
)
from interp_toolkit.tasks.induction_corpus import CorpusConfig, repeated_random_tokens


def configs(quick: bool) -> tuple[TestbedConfig, LMBIFConfig, dict]:
    if quick:
        corpus = CorpusConfig(n_sequences=256, seq_len=24, n_ordinary=16, chunk_min=4, chunk_max=8)
        testbed = TestbedConfig(corpus=corpus, n_layers=2, n_heads=2, d_model=32, d_mlp=64, total_steps=64,
                                linear_every=32, batch_size=16, warmup_steps=8)
        sampler = SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=2, draws=8, burn_in=4, batch_size=16)
        sizes = {"n_posterior": 128, "n_train": 8, "n_query": 8}
    else:
        # Calibrated (benchmarks/calibrate_lm_testbed.py, docs/lm_bif.md): with 64 ordinary
        # tokens the induction score leaves chance around step 600 and plateaus near 0.85.
        corpus = CorpusConfig(n_sequences=2048, seq_len=48, n_ordinary=64, chunk_min=10, chunk_max=20)
        testbed = TestbedConfig(corpus=corpus, total_steps=2000, linear_every=50, batch_size=64, lr=1e-3)
        sampler = SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=4, draws=25, burn_in=25, batch_size=16)
        sizes = {"n_posterior": 512, "n_train": 16, "n_query": 16}
    return testbed, LMBIFConfig(sampler, reductions=("class:class", "class:all", "sequence:sequence")), sizes


def select_checkpoints(refs: list, corpus: CorpusConfig, every: int, dense_every: int) -> list:
    """Checkpoints for the BIF: every ``every`` steps, and every ``dense_every`` steps from
    one ``every`` before the transition's "during" window to one ``dense_every`` after it
    (the window comes from the induction score, cheap to compute at every checkpoint)."""
    half = (corpus.seq_len - 1) // 2
    probe = repeated_random_tokens(32, half, corpus.first_ordinary, corpus.vocab_size, seed=corpus.seed + 77)
    scores = [induction_score(ref.load(), probe, half) for ref in refs]
    phases = induction_phases([r.step for r in refs], scores)
    start = (phases["start"] or 0) - every // 2
    end = (phases["end"] or 0) + dense_every
    return [r for r in refs if r.step % every == 0 or (start <= r.step <= end and r.step % dense_every == 0)
            or r.step == refs[-1].step]


def closing_note(csv_path: Path) -> str:
    """A few sentences read off the table: induction transition and per-class BIF around it."""
    rows = [r for r in csv.DictReader(open(csv_path)) if r["reduction"] == "class:all"]
    steps = sorted({int(r["step"]) for r in rows})
    score = {int(r["step"]): float(r["induction_score"]) for r in rows}
    bif = {(int(r["step"]), r["train_group"]): float(r["bif"]) for r in rows}
    classes = sorted({r["train_group"] for r in rows})
    phases = induction_phases(steps, [score[s] for s in steps])
    lines = [f"Induction score: {score[steps[0]]:.3f} at step {steps[0]}, max {max(score.values()):.3f}, "
             f"{score[steps[-1]]:.3f} at step {steps[-1]}; formation (max slope) at step {phases['formation_step']}, "
             f"during = steps {phases['start']}..{phases['end']} (10%..90% of the rise)."]
    start, end = phases["start"] or steps[-1], phases["end"] or steps[-1]
    for cls in classes:
        series = [bif[(s, cls)] for s in steps if (s, cls) in bif]
        peak_i = max(range(len(series)), key=lambda i: abs(series[i]))

        def mean(selected: list[int], cls: str = cls) -> float:
            values = [bif[(s, cls)] for s in selected if (s, cls) in bif]
            return sum(values) / len(values) if values else float("nan")

        before = mean([s for s in steps if 0 < s < start])
        during = mean([s for s in steps if start <= s <= end])
        after = mean([s for s in steps if s > end])
        lines.append(f"BIF(train {cls} tokens -> mean query loss): mean before {before:+.2e}, during {during:+.2e}, "
                     f"after {after:+.2e}; largest magnitude {series[peak_i]:+.2e} at step {steps[peak_i]}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/lm_bif_testbed"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    testbed, config, sizes = configs(args.quick)
    start = time.perf_counter()
    refs = train_testbed(testbed, args.out / "testbed")
    print(f"testbed: {len(refs)} checkpoints (steps {[r.step for r in refs]}) in {time.perf_counter() - start:.0f} s")
    if not args.quick:
        refs = select_checkpoints(refs, testbed.corpus, every=200, dense_every=50)
        print(f"BIF at steps {[r.step for r in refs]}")
    start = time.perf_counter()
    # the study's fixed protocol (docs/lm_bif.md reports its convergence); the bif-lm command
    # extends chains until they converge instead
    bif_over_checkpoints(refs, testbed.corpus, config, args.out / "bif", adaptive=AdaptiveConfig(adaptive=False),
                         **sizes)
    print(f"BIF over checkpoints in {time.perf_counter() - start:.0f} s")
    rows = list(csv.DictReader(open(args.out / "bif" / "per_class.csv")))
    save_figure(plot_testbed_bif(rows), args.out / "testbed_bif.png")
    note = closing_note(args.out / "bif" / "per_class.csv")
    atomic_write_text(args.out / "note.txt", note)
    print(note)
    print(json.dumps({"figure": str(args.out / "testbed_bif.png"), "table": str(args.out / "bif" / "per_class.csv")}))


if __name__ == "__main__":
    main()
