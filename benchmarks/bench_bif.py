"""Benchmark of the BIF sampler: draws per second and peak memory vs the number of
recorded examples, and the same measurement for ``devinterp`` (Timaeus, PyPI
``devinterp``; optional extra ``compare``) on the same model and settings, as a ratio.

Model: a 2-layer TransformerBridge language model (``build_model``, d_model 64, 2 heads,
vocab 64, 16 tokens). SGLD on 256 random sequences, minibatch 32, ``eps = 1e-4``,
``gamma = 100``, ``n_beta = 30``, no burn-in, one step between draws, 2 chains.

What each side does per draw (like for like): one SGLD step (forward + backward on a
minibatch of 32 pool sequences), then a forward pass over all ``n`` recorded sequences
recording each one's mean next-token loss. ``devinterp`` runs the bridge's forward
(``model(tokens)``), records in forward batches of 32 (its recording batch is its SGLD
batch; ``(dataset, n // 32)`` batches per draw) and keeps the per-token losses (``[n, 15]``
float32 per draw, in a zarr store) that it averages over positions at the end. Ours runs
the library's ``next_token_losses`` (on a toolkit model: the lean forward over the
bridge's own parameters, ``interp_toolkit.runs.forward.SequenceForward``, equal to the
bridge's logits up to float rounding), records in batches of ``--ours-eval-batch`` (64:
as fast as 128 for this model here at n <= 512 and 4% slower at 2,048, with a lower peak
(n = 128: 8-12 MiB vs 16-18 MiB); the library default ``SamplerConfig.eval_batch_size``
is 1024) and keeps the per-sequence values only. Both
then estimate the ``n x n`` sequence-level covariance over the 2 x draws draws
(``devinterp``: ``correlation_method="sequence"``, ``compute_covariance=True``; ours:
``-Cov`` streamed, plus per-chain estimates, the jackknife and per-chain standard errors and
the convergence diagnostics of 16 x 16 tracked entries). Fixed costs stay in both
totals (devinterp: an initial loss over 32 batches per chain, a model copy per chain, the
zarr store; ours: an initial loss over the pool and one probing pass over the recorded
set).

Each measurement runs in a fresh subprocess (``--repeats`` times, alternating libraries,
fastest kept: the machines are shared and noisy). Before measuring, every worker runs the
same warm-up (one forward + backward on a minibatch, one recording forward), so one-time
costs of the process (kernel set-up, code pages) count for neither side. Time is wall
clock and process CPU time (all threads; on a loaded machine the CPU time is the steadier
measure); memory is the peak resident set size of the process above its size just before
the call (``ru_maxrss``). A third worker, ``floor``, times the model work of a draw alone
(the SGLD step plus the recording forwards: ours' lean forward in ours' batches; the
bridge's forward in ours' batches and in devinterp's): its ``ceiling`` = devinterp's CPU
seconds per draw / the lean floor is the largest speed-up any implementation doing that
model work could show. Run::

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
OURS_EVAL_BATCH = 64


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
    # The same warm-up for every worker: one-time costs of the process count for no side.
    _sequence_loss(model, pool[:BATCH]).mean().backward()
    model.zero_grad(set_to_none=True)
    with torch.inference_mode():
        _sequence_loss(model, recorded[:BATCH])
    return model, pool, recorded


def _sequence_loss(model, tokens):
    import torch.nn.functional as F

    logits = model(tokens)
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
    return losses.view(tokens.shape[0], -1).mean(-1)


def _timed(fn) -> dict:
    before = _rss_mib()
    cpu_start = time.process_time()
    start = time.perf_counter()
    out = fn()
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start,
            "rss_before_mib": before, "out": out}


def _lean_sequence_loss(model, tokens):
    """Ours: the library's next-token losses (the lean forward over the bridge's parameters)."""
    from interp_toolkit.analyses.bif.lm_tokens import next_token_losses

    return next_token_losses(model, tokens).mean(-1)


def worker_ours(n: int, chains: int, draws: int, out: Path, eval_batch: int, seed: int = 0) -> dict:
    import numpy as np

    from interp_toolkit.analyses.bif import SamplerConfig, bif

    model, pool, recorded = _setup(n)
    _lean_sequence_loss(model, pool[:BATCH]).mean().backward()  # the same warm-up, lean forward
    model.zero_grad(set_to_none=True)
    config = SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=chains, draws=draws, burn_in=0,
                           steps_between_draws=1, batch_size=BATCH, seed=seed, progress=False,
                           eval_batch_size=eval_batch)
    record = _timed(lambda: bif(model, pool, recorded, _lean_sequence_loss, config, attribution_data=recorded))
    np.save(out, record.pop("out").bif.numpy())
    return record


def worker_floor(n: int, chains: int, draws: int, eval_batch: int) -> dict:
    """CPU seconds per draw of the model work alone: one SGLD forward + backward on a
    minibatch and one forward over the ``n`` recorded sequences, in batches of
    ``eval_batch`` through the lean forward (ours), the bridge (ours' batches) and the
    bridge in batches of the SGLD batch (devinterp's)."""
    import torch

    model, pool, recorded = _setup(n)
    _lean_sequence_loss(model, pool[:BATCH]).mean().backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    iterations = min(chains * draws, 20)

    def per_draw(loss, record_batch: int) -> float:
        start = time.process_time()
        for i in range(iterations):
            rows = (i * BATCH) % POOL
            loss(model, pool[rows : rows + BATCH]).mean().backward()
            model.zero_grad(set_to_none=True)
            with torch.inference_mode():
                for s in range(0, n, record_batch):
                    loss(model, recorded[s : s + record_batch])
        return (time.process_time() - start) / iterations

    return {"floor_cpu_s_per_draw": per_draw(_lean_sequence_loss, eval_batch),
            "floor_bridge_cpu_s_per_draw": per_draw(_sequence_loss, eval_batch),
            "floor32_cpu_s_per_draw": per_draw(_sequence_loss, BATCH),
            "seconds": 0.0, "cpu_seconds": 0.0, "rss_before_mib": _rss_mib()}


def worker_devinterp(n: int, chains: int, draws: int, out: Path) -> dict:
    import random

    import numpy as np
    from datasets import Dataset
    from devinterp.slt.bif import bif as devinterp_bif

    model, pool, recorded = _setup(n)

    def per_token_loss(model, input_ids):
        import torch.nn.functional as F

        # classes on the last dim, as ours: log-softmax over dim 1 of [B, V, T] is several
        # times slower here, and that layout is not what is compared
        logits = model(input_ids)
        batch, seq = input_ids.shape
        return F.cross_entropy(logits[:, :-1].reshape(batch * (seq - 1), -1), input_ids[:, 1:].reshape(-1),
                               reduction="none").view(batch, seq - 1)

    pool_ds = Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch")
    rec_ds = Dataset.from_dict({"input_ids": recorded.tolist()}).with_format("torch")
    record = _timed(lambda: devinterp_bif(
        model, pool_ds, {"rec": (rec_ds, max(1, n // BATCH))}, lr=1e-4, n_beta=30.0, localization=100.0,
        num_chains=chains, num_draws=draws, batch_size=BATCH, num_burnin_steps=0, num_steps_bw_draws=1,
        correlation_method="sequence", compute_covariance=True, device="cpu", loss_fn=per_token_loss,
    ))
    result = record.pop("out")
    # devinterp records the observable set in a fixed shuffled order (its
    # DeterministicShuffledSampler, seed obs_seed = 1337): put rows/columns back in ours.
    order = random.Random(1337).sample(range(n), n)
    shuffled = np.asarray(result["influences"].values)
    matrix = np.empty_like(shuffled)
    matrix[np.ix_(order, order)] = shuffled
    np.save(out, matrix)
    return record


def run_worker(kind: str, n: int, chains: int, draws: int, tmp: Path, eval_batch: int) -> dict:
    out = tmp / f"{kind}_{n}.npy"
    cmd = [sys.executable, "-W", "ignore", __file__, "--worker", kind.split("#")[0], "--n", str(n),
           "--seed", kind.split("#")[1] if "#" in kind else "0", "--ours-eval-batch", str(eval_batch),
           "--chains", str(chains), "--draws", str(draws), "--matrix-out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    if kind != "floor":
        record["draws_per_s"] = chains * draws / record["seconds"]
        record["draws_per_cpu_s"] = chains * draws / record["cpu_seconds"]
        record["matrix"] = str(out)
    return record


def _keep_best(row: dict, kind: str, record: dict) -> None:
    """Fastest wall time, fastest CPU time and the smallest peak, each over the repeats."""
    if "error" in record:
        row.setdefault(kind, record)
        return
    best = row.get(kind)
    if best is None or "error" in best:
        row[kind] = {**record, "runs": [record]}
        return
    best["runs"].append(record)
    for key, pick in (("seconds", min), ("cpu_seconds", min), ("floor_cpu_s_per_draw", min),
                      ("floor_bridge_cpu_s_per_draw", min), ("floor32_cpu_s_per_draw", min),
                      ("peak_increase_mib", min)):
        if key in record:
            best[key] = pick(best[key], record[key])
    for key in ("draws_per_s", "draws_per_cpu_s"):
        if key in record:
            best[key] = max(best[key], record[key])
    if record["seconds"] <= best["seconds"] and "matrix" in record:
        best["matrix"] = record["matrix"]


LIKE_FOR_LIKE = """\
Per draw, both: 1 SGLD step (forward + backward, minibatch 32 of 256 pool sequences) and a
forward over all n recorded sequences (per-sequence mean next-token loss); both estimate the
n x n covariance over 2 chains. devinterp records in batches of 32 and keeps per-token losses;
ours runs the library's lean forward (equal to the bridge's up to rounding) in batches of
{eval_batch} and keeps per-sequence values (+ per-chain estimates, jackknife and per-chain standard
errors, convergence diagnostics); devinterp
runs the bridge's forward. Same warm-up for both; best of {repeats} alternating fresh processes;
memory = peak RSS above the RSS before the call. floor = CPU s/draw of the model work alone
(lean forward, ours' batches); ceiling = devinterp CPU s/draw / floor (the most any
implementation of that work could gain)."""


def main() -> None:
    parser = argparse.ArgumentParser(description="BIF sampler benchmark")
    parser.add_argument("--n", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--compare-devinterp", action="store_true")
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting (alternating); fastest kept")
    parser.add_argument("--out", default="runs/bench_bif/results.json")
    parser.add_argument("--ours-eval-batch", type=int, default=OURS_EVAL_BATCH,
                        help="ours' recording batch (SamplerConfig.eval_batch_size)")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["ours", "devinterp", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--matrix-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        n = args.n[0]
        if args.worker == "ours":
            record = worker_ours(n, args.chains, args.draws, Path(args.matrix_out), args.ours_eval_batch, args.seed)
        elif args.worker == "floor":
            record = worker_floor(n, args.chains, args.draws, args.ours_eval_batch)
        else:
            record = worker_devinterp(n, args.chains, args.draws, Path(args.matrix_out))
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
    kinds = ["ours"] + (["devinterp", "floor", "ours#1"] if args.compare_devinterp else [])
    if args.compare_devinterp:
        print(LIKE_FOR_LIKE.format(eval_batch=args.ours_eval_batch, repeats=args.repeats))
    print(f"{'library':>10} {'n':>6} {'draws/s':>9} {'draws/cpu-s':>12} {'peak +MiB':>10} {'seconds':>8}")
    for n in args.n:
        row = {"n_recorded": n, "accumulator_mib": args.chains * n * n * 4 / 2**20}  # float32 co-moments
        for repeat in range(args.repeats):  # alternate libraries; keep each one's best
            for kind in kinds:
                if kind in ("ours#1", "floor") and repeat > 0:
                    continue  # the second seed (estimator noise floor) and the floor: once
                _keep_best(row, kind, run_worker(kind, n, args.chains, args.draws, tmp, args.ours_eval_batch))
        for kind in kinds:
            record = row[kind]
            if "error" in record:
                print(f"{kind:>10} {n:>6} error: {record['error']}")
            elif kind == "floor":
                print(f"{kind:>10} {n:>6} model work per draw: {record['floor_cpu_s_per_draw'] * 1e3:.1f} ms CPU "
                      f"(bridge forward: {record['floor_bridge_cpu_s_per_draw'] * 1e3:.1f} ms; "
                      f"bridge in batches of {BATCH}: {record['floor32_cpu_s_per_draw'] * 1e3:.1f} ms)")
            else:
                print(f"{kind:>10} {n:>6} {record['draws_per_s']:9.2f} {record['draws_per_cpu_s']:12.2f} "
                      f"{record['peak_increase_mib']:10.1f} {record['seconds']:8.1f}")
        if "devinterp" in row and "error" not in row["devinterp"] and "error" not in row["ours"]:
            ours, theirs = row["ours"], row["devinterp"]
            row["speed_ratio_ours_over_devinterp"] = ours["draws_per_s"] / theirs["draws_per_s"]
            row["cpu_speed_ratio_ours_over_devinterp"] = ours["draws_per_cpu_s"] / theirs["draws_per_cpu_s"]
            row["memory_ratio_ours_over_devinterp"] = ours["peak_increase_mib"] / max(theirs["peak_increase_mib"], 1e-9)
            if "error" not in row.get("floor", {"error": 1}):
                row["ceiling_cpu_speed_ratio"] = 1 / theirs["draws_per_cpu_s"] / row["floor"]["floor_cpu_s_per_draw"]
            ours_m = np.load(ours["matrix"])
            theirs_m = np.load(theirs["matrix"])
            if theirs_m.shape == ours_m.shape:
                # Different noise streams: agreement of the two estimates, not equality. The
                # reference is ours against ours with another seed (the estimator's noise floor).
                row["matrix_correlation"] = float(np.corrcoef(ours_m.ravel(), -theirs_m.ravel())[0, 1])
                if "error" not in row.get("ours#1", {"error": 1}):
                    other = np.load(row["ours#1"]["matrix"])
                    row["matrix_correlation_ours_two_seeds"] = float(np.corrcoef(ours_m.ravel(), other.ravel())[0, 1])
            else:
                row["matrix_shapes"] = [list(ours_m.shape), list(theirs_m.shape)]
            print(f"{'ratio':>10} {n:>6} speed x{row['speed_ratio_ours_over_devinterp']:.2f} (wall), "
                  f"x{row['cpu_speed_ratio_ours_over_devinterp']:.2f} (CPU; ceiling "
                  f"x{row.get('ceiling_cpu_speed_ratio', float('nan')):.2f}), "
                  f"memory x{row['memory_ratio_ours_over_devinterp']:.2f}, "
                  f"corr(ours, -devinterp) {row.get('matrix_correlation', float('nan')):.2f} "
                  f"(ours seed 0 vs 1: {row.get('matrix_correlation_ours_two_seeds', float('nan')):.2f})")
        rows.append(row)
    atomic_write_json(out, {"settings": vars(args), "rows": rows})
    if args.compare_devinterp:
        print("\n| n | speed (wall) | speed (CPU) | ceiling (CPU) | memory |\n|---|---|---|---|---|")
        for row in rows:
            if "speed_ratio_ours_over_devinterp" in row:
                print(f"| {row['n_recorded']} | {row['speed_ratio_ours_over_devinterp']:.2f}x | "
                      f"{row['cpu_speed_ratio_ours_over_devinterp']:.2f}x | "
                      f"{row.get('ceiling_cpu_speed_ratio', float('nan')):.2f}x | "
                      f"{row['memory_ratio_ours_over_devinterp']:.2f}x |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
