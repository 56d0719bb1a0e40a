"""Benchmark of the token-level LM BIF: draws per second and peak memory, ours vs ``devinterp``.

Model: a random tiny GPTNeoX (2 layers, d_model 64, 4 heads, vocab 55, 32 tokens) saved
locally and loaded through ``TransformerBridge.boot_transformers`` for both libraries. SGLD
on 256 corpus sequences, minibatch ``n`` (devinterp uses one batch size for minibatches and
observables), ``eps = 1e-4``, ``gamma = 100``, ``n_beta = 30``, no burn-in, one step between
draws. At every draw both record the per-token losses of ``n`` sequences and estimate the
full token-level BIF ``(n x 31) x (n x 31)`` (devinterp: ``correlation_method="token"``,
``compute_covariance=True``; ours: ``"token:token"``, computed once from the kept draws since
its matrix is larger than the draws, plus the streamed ``"class:class"`` reduction; ours also
gives jackknife standard errors). Timing includes sampling and the BIF computation. Goal:
ours >= 2x devinterp's draws/s and peak memory <= devinterp's at every size (docs/lm_bif.md).

Each measurement runs in a fresh subprocess (``--repeats`` times, alternating libraries,
fastest kept: the machines are shared and noisy); memory is the peak resident set size
above the size just before sampling (``ru_maxrss``), so imports do not count. Run::

    python benchmarks/bench_lm_bif.py --compare-devinterp     # needs `pip install -e ".[compare]"`
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

POOL = 256


def _rss_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _setup(n: int, tmp: Path):
    import torch
    from transformers import GPTNeoXForCausalLM

    from interp_toolkit.sources import CheckpointRef
    from interp_toolkit.studies.lm.testbed import TestbedConfig, gptneox_config
    from interp_toolkit.tasks.induction_corpus import CorpusConfig, make_corpus

    torch.set_num_threads(1)
    corpus_cfg = CorpusConfig(n_sequences=POOL, seq_len=32, chunk_min=6, chunk_max=12)
    path = tmp / "model"
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        GPTNeoXForCausalLM(gptneox_config(TestbedConfig(corpus=corpus_cfg))).save_pretrained(path)
    model = CheckpointRef("hf_local", str(path)).load()
    corpus = make_corpus(corpus_cfg)
    return model, corpus, corpus.tokens[:n]


def worker_ours(n: int, chains: int, draws: int, tmp: Path) -> dict:
    from interp_toolkit.analyses.bif import SamplerConfig
    from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet
    from interp_toolkit.tasks.induction_corpus import CLASS_NAMES, target_classes

    model, corpus, recorded = _setup(n, tmp)
    rec = TokenSet(recorded, target_classes(corpus.classes[:n]), CLASS_NAMES)
    config = LMBIFConfig(SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=chains, draws=draws, burn_in=0,
                                       batch_size=n, eval_batch_size=n, progress=False),
                         reductions=("token:token", "class:class"))
    before = _rss_mib()
    start = time.perf_counter()
    lm_bif(model, corpus.tokens, rec, None, config)
    return {"seconds": time.perf_counter() - start, "rss_before_mib": before}


def worker_devinterp(n: int, chains: int, draws: int, tmp: Path) -> dict:
    from datasets import Dataset
    from devinterp.slt.bif import bif as devinterp_bif

    from interp_toolkit.analyses.bif.lm_tokens import next_token_losses

    model, corpus, recorded = _setup(n, tmp)
    pool_ds = Dataset.from_dict({"input_ids": corpus.tokens.tolist()}).with_format("torch")
    rec_ds = Dataset.from_dict({"input_ids": recorded.tolist()}).with_format("torch")
    before = _rss_mib()
    start = time.perf_counter()
    devinterp_bif(model, pool_ds, {"rec": (rec_ds, 1)}, lr=1e-4, n_beta=30.0, localization=100.0,
                  num_chains=chains, num_draws=draws, batch_size=n, num_burnin_steps=0, num_steps_bw_draws=1,
                  correlation_method="token", compute_covariance=True, device="cpu", bif_device="cpu",
                  loss_fn=next_token_losses)
    return {"seconds": time.perf_counter() - start, "rss_before_mib": before}


def run_worker(kind: str, n: int, chains: int, draws: int, tmp: Path) -> dict:
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", kind, "--n", str(n), "--chains", str(chains),
           "--draws", str(draws), "--tmp", str(tmp)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["draws_per_s"] = chains * draws / record["seconds"]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description="token-level LM BIF benchmark")
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32], help="recorded sequences (x31 tokens)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--compare-devinterp", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting (alternating); fastest kept")
    parser.add_argument("--out", default="runs/bench_lm_bif/results.json")
    parser.add_argument("--worker", choices=["ours", "devinterp"], help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        fn = worker_ours if args.worker == "ours" else worker_devinterp
        record = fn(args.n[0], args.chains, args.draws, Path(args.tmp))
        record["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        record["peak_increase_mib"] = record["peak_rss_mib"] - record.pop("rss_before_mib")
        print(json.dumps(record))
        return

    from interp_toolkit.io import atomic_write_json

    out = Path(args.out)
    tmp = out.parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    kinds = ["ours"] + (["devinterp"] if args.compare_devinterp else [])
    rows = []
    print(f"{'library':>10} {'n_seq':>6} {'tokens':>7} {'draws/s':>9} {'peak +MiB':>10} {'seconds':>8}")
    for n in args.n:
        row = {"n_sequences": n, "n_tokens": n * 31,
               "full_matrix_accumulator_mib": (args.chains + 1) * (n * 31) ** 2 * 8 / 2**20}
        for _ in range(args.repeats):
            for kind in kinds:
                record = run_worker(kind, n, args.chains, args.draws, tmp)
                if kind not in row or ("error" not in record and record["seconds"] < row[kind].get("seconds", 1e18)):
                    row[kind] = record
        for kind in kinds:
            rec = row[kind]
            if "error" in rec:
                print(f"{kind:>10} {n:>6} error: {rec['error']}")
            else:
                print(f"{kind:>10} {n:>6} {n * 31:>7} {rec['draws_per_s']:9.2f} {rec['peak_increase_mib']:10.1f} "
                      f"{rec['seconds']:8.1f}")
        if "devinterp" in row and "error" not in row["devinterp"] and "error" not in row["ours"]:
            row["speed_ratio_ours_over_devinterp"] = row["ours"]["draws_per_s"] / row["devinterp"]["draws_per_s"]
            row["memory_ratio_ours_over_devinterp"] = (
                row["ours"]["peak_increase_mib"] / max(row["devinterp"]["peak_increase_mib"], 1e-9))
            print(f"{'ratio':>10} {n:>6} speed x{row['speed_ratio_ours_over_devinterp']:.2f}, "
                  f"memory x{row['memory_ratio_ours_over_devinterp']:.2f} (ours / devinterp)")
        rows.append(row)
    atomic_write_json(out, {"settings": vars(args), "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
