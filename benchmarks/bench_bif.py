"""Benchmark of the BIF sampler: draws per second and peak memory vs the number of
recorded examples, and the same measurement for ``devinterp`` (Timaeus, PyPI
``devinterp``; optional extra ``compare``) on the same model and settings, as a ratio.

Model: a 2-layer TransformerBridge language model (``build_model``, d_model 64, 2 heads,
vocab 64, 16 tokens). SGLD on 256 random sequences, minibatch 32, ``eps = 1e-4``,
``gamma = 100``, ``n_beta = 30``, no burn-in, one step between draws. At every draw both
libraries record the per-sequence mean next-token loss of ``n`` sequences (forward
batches of 32) and estimate the ``n x n`` sequence-level BIF (``devinterp``:
``correlation_method="sequence"``, ``compute_covariance=True``; ours: ``-Cov`` of the
same recorded set, streamed).

Each measurement runs in a fresh subprocess (``--repeats`` times, alternating libraries,
fastest kept: the machines are shared and noisy); memory is the peak resident set size of
that process above its size just before sampling (``ru_maxrss``), so library imports do
not count. ``ours`` runs with the library's default recording batch
(``SamplerConfig.eval_batch_size``, 1024); ``ours@32`` records in batches of 32 like
devinterp (which ties its recording batch to the SGLD batch). Run::

    python benchmarks/bench_bif.py                       # ours only
    python benchmarks/bench_bif.py --compare-devinterp   # needs `pip install -e ".[compare]"`
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

SEQ_LEN = 16
VOCAB = 64
POOL = 256
BATCH = 32


def _rss_mib() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _setup(n: int):
    import torch

    from interp_toolkit.model import ModelConfig, build_model

    torch.set_num_threads(1)
    model = build_model(ModelConfig(n_layers=2, n_heads=2, d_vocab=VOCAB, n_ctx=SEQ_LEN, d_model=64, d_mlp=128, seed=0))
    gen = torch.Generator().manual_seed(0)
    pool = torch.randint(0, VOCAB, (POOL, SEQ_LEN), generator=gen)
    recorded = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=gen)
    return model, pool, recorded


def _sequence_loss(model, tokens):
    import torch.nn.functional as F

    logits = model(tokens)
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
    return losses.view(tokens.shape[0], -1).mean(-1)


def worker_ours(n: int, chains: int, draws: int, out: Path, eval_batch: int | None = None, seed: int = 0) -> dict:
    import numpy as np

    from interp_toolkit.analyses.bif import SamplerConfig, bif

    model, pool, recorded = _setup(n)
    # eval_batch None: the library's default recording batch (SamplerConfig.eval_batch_size).
    batch_kw = {} if eval_batch is None else {"eval_batch_size": eval_batch}
    config = SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=chains, draws=draws, burn_in=0,
                           steps_between_draws=1, batch_size=BATCH, seed=seed, progress=False, **batch_kw)
    before = _rss_mib()
    start = time.perf_counter()
    result = bif(model, pool, recorded, _sequence_loss, config, attribution_data=recorded)
    seconds = time.perf_counter() - start
    np.save(out, result.bif.numpy())
    return {"seconds": seconds, "rss_before_mib": before}


def worker_devinterp(n: int, chains: int, draws: int, out: Path) -> dict:
    import numpy as np
    from datasets import Dataset
    from devinterp.slt.bif import bif as devinterp_bif

    model, pool, recorded = _setup(n)

    def per_token_loss(model, input_ids):
        import torch.nn.functional as F

        logits = model(input_ids)
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[:, 1:], reduction="none")

    pool_ds = Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch")
    rec_ds = Dataset.from_dict({"input_ids": recorded.tolist()}).with_format("torch")
    before = _rss_mib()
    start = time.perf_counter()
    result = devinterp_bif(
        model, pool_ds, {"rec": (rec_ds, max(1, n // BATCH))}, lr=1e-4, n_beta=30.0, localization=100.0,
        num_chains=chains, num_draws=draws, batch_size=BATCH, num_burnin_steps=0, num_steps_bw_draws=1,
        correlation_method="sequence", compute_covariance=True, device="cpu", loss_fn=per_token_loss,
    )
    seconds = time.perf_counter() - start
    # devinterp records the observable set in a fixed shuffled order (its
    # DeterministicShuffledSampler, seed obs_seed = 1337): put rows/columns back in ours.
    import random

    order = random.Random(1337).sample(range(n), n)
    shuffled = np.asarray(result["influences"].values)
    matrix = np.empty_like(shuffled)
    matrix[np.ix_(order, order)] = shuffled
    np.save(out, matrix)
    return {"seconds": seconds, "rss_before_mib": before}


def run_worker(kind: str, n: int, chains: int, draws: int, tmp: Path, eval_batch: int | None = None) -> dict:
    out = tmp / f"{kind}_{n}.npy"
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", kind.split("@")[0].split("#")[0], "--n", str(n),
           "--seed", kind.split("#")[1] if "#" in kind else "0",
           "--chains", str(chains), "--draws", str(draws), "--matrix-out", str(out)]
    if eval_batch is not None:
        cmd += ["--eval-batch", str(eval_batch)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    record["draws_per_s"] = chains * draws / record["seconds"]
    record["matrix"] = str(out)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description="BIF sampler benchmark")
    parser.add_argument("--n", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--compare-devinterp", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting (alternating); fastest kept")
    parser.add_argument("--out", default="runs/bench_bif/results.json")
    parser.add_argument("--ours-eval-batch", type=int, default=BATCH,
                        help="also time ours recording in forward batches of this size (devinterp ties its "
                             "recording batch to the SGLD batch, 32); 0: skip")
    parser.add_argument("--eval-batch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["ours", "devinterp"], help=argparse.SUPPRESS)
    parser.add_argument("--matrix-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        if args.worker == "ours":
            record = worker_ours(args.n[0], args.chains, args.draws, Path(args.matrix_out), args.eval_batch, args.seed)
        else:
            record = worker_devinterp(args.n[0], args.chains, args.draws, Path(args.matrix_out))
        record["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        record["peak_increase_mib"] = record["peak_rss_mib"] - record.pop("rss_before_mib")
        print(json.dumps(record))
        return

    import numpy as np

    from interp_toolkit.io import atomic_write_json

    out = Path(args.out)
    tmp = out.parent / "matrices"
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    kinds = ["ours"] + (["devinterp", "ours#1"] if args.compare_devinterp else [])
    if args.ours_eval_batch:
        kinds.append(f"ours@{args.ours_eval_batch}")
    print(f"{'library':>10} {'n':>6} {'draws/s':>9} {'peak +MiB':>10} {'seconds':>8}")
    for n in args.n:
        row = {"n_recorded": n, "accumulator_mib": args.chains * n * n * 4 / 2**20}  # float32 co-moments
        for _ in range(args.repeats):  # alternate libraries; keep each one's fastest run
            for kind in kinds:
                eval_batch = int(kind.split("@")[1]) if "@" in kind else None
                record = run_worker(kind, n, args.chains, args.draws, tmp, eval_batch)
                if kind not in row or ("error" not in record and record["seconds"] < row[kind].get("seconds", 1e18)):
                    row[kind] = record
        for kind in kinds:
            record = row[kind]
            if "error" in record:
                print(f"{kind:>10} {n:>6} error: {record['error']}")
            else:
                print(f"{kind:>10} {n:>6} {record['draws_per_s']:9.2f} {record['peak_increase_mib']:10.1f} "
                      f"{record['seconds']:8.1f}")
        if "devinterp" in row and "error" not in row["devinterp"] and "error" not in row["ours"]:
            row["speed_ratio_ours_over_devinterp"] = row["ours"]["draws_per_s"] / row["devinterp"]["draws_per_s"]
            row["memory_ratio_ours_over_devinterp"] = (
                row["ours"]["peak_increase_mib"] / max(row["devinterp"]["peak_increase_mib"], 1e-9)
            )
            ours_m = np.load(row["ours"]["matrix"])
            theirs = np.load(row["devinterp"]["matrix"])
            if theirs.shape == ours_m.shape:
                # Different noise streams: agreement of the two estimates, not equality. The
                # reference is ours against ours with another seed (the estimator's noise floor).
                row["matrix_correlation"] = float(np.corrcoef(ours_m.ravel(), -theirs.ravel())[0, 1])
                if "error" not in row.get("ours#1", {"error": 1}):
                    other = np.load(row["ours#1"]["matrix"])
                    row["matrix_correlation_ours_two_seeds"] = float(np.corrcoef(ours_m.ravel(), other.ravel())[0, 1])
            else:
                row["matrix_shapes"] = [list(ours_m.shape), list(theirs.shape)]
            matched = f"ours@{args.ours_eval_batch}"
            if args.ours_eval_batch and "error" not in row.get(matched, {"error": 1}):
                row["speed_ratio_matched_batch_over_devinterp"] = (
                    row[matched]["draws_per_s"] / row["devinterp"]["draws_per_s"]
                )
                row["memory_ratio_matched_batch_over_devinterp"] = (
                    row[matched]["peak_increase_mib"] / max(row["devinterp"]["peak_increase_mib"], 1e-9)
                )
                print(f"{'ratio':>10} {n:>6} {matched}: speed x{row['speed_ratio_matched_batch_over_devinterp']:.2f}, "
                      f"memory x{row['memory_ratio_matched_batch_over_devinterp']:.2f}")
            print(f"{'ratio':>10} {n:>6} speed x{row['speed_ratio_ours_over_devinterp']:.2f}, "
                  f"memory x{row['memory_ratio_ours_over_devinterp']:.2f}, "
                  f"corr(ours, -devinterp) {row.get('matrix_correlation', float('nan')):.2f} "
                  f"(ours seed 0 vs 1: {row.get('matrix_correlation_ours_two_seeds', float('nan')):.2f})")
        rows.append(row)
    atomic_write_json(out, {"settings": vars(args), "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
