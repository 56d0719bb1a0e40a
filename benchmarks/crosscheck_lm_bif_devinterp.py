"""Cross-check of the token-level BIF against ``devinterp`` 2.0.1 (Timaeus) ``bif()``.

Same model (a briefly trained testbed GPTNeoX, loaded through ``boot_transformers``), same
data (SGLD pool: the first ``--n-posterior`` corpus sequences; recorded set: ``--n-rec``
sequences), same SGLD settings (``lr = eps``, ``localization = gamma``, ``n_beta``, chains,
draws, burn-in, minibatch) and the same per-token loss function.

Conventions: devinterp returns ``+Corr`` (default) or ``+Cov`` with the unbiased ``1/(N-1)``
normalization over the pooled ``chains x draws`` draws; ours is ``-Cov`` with ``1/N`` (or
``-Corr``). So ``ours = -devinterp_cov x (N - 1) / N`` and ``ours_pearson = -devinterp_corr``.

Checks:

1. **Estimator, exact**: our estimator applied to devinterp's *own stored draws* must
   reproduce devinterp's matrix to float32 rounding (covariance, correlation, and the
   ``token_mean`` Pearson convention = devinterp's ``average_tokenwise_bif``).
2. **Sampler, statistical**: the samplers use different random streams, so estimates can
   only agree within sampling noise. Four runs: ours with seeds 0 and 1, devinterp with
   ``init_seed`` 100 and 200 (``match_sampling_input_ids_across_chains=False``, independent
   chains like ours). For each pair, z-scores of the class-level BIF
   ``(x - y) / sqrt(se_x^2 + se_y^2)`` with two standard errors of the pooled estimate:
   ``per_chain`` (std of the chains' own estimates / sqrt(chains), the toolkit's first
   one) and ``jackknife`` (leave-one-chain-out of the pooled estimate). The *null* pairs
   (ours vs ours, devinterp vs devinterp) show what |z| sampling noise alone gives.
3. **Mixing**: the share of the pooled class-level covariance that is *between* chains
   (the covariance of the chains' mean losses), which the per-chain standard error misses.

Run (needs ``pip install -e ".[compare]"``)::

    python benchmarks/crosscheck_lm_bif_devinterp.py --out runs/crosscheck_lm_bif
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/crosscheck_lm_bif"))
    parser.add_argument("--n-posterior", type=int, default=256)
    parser.add_argument("--n-rec", type=int, default=16)
    parser.add_argument("--chains", type=int, default=8)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--burn-in", type=int, default=200, help="localization time 2/(eps gamma) = 200 steps")
    parser.add_argument("--steps-between-draws", type=int, default=1)
    parser.add_argument("--eps", type=float, default=1e-4)
    parser.add_argument("--gamma", type=float, default=100.0)
    parser.add_argument("--n-beta", type=float, default=30.0)
    parser.add_argument("--train-steps", type=int, default=300, help="testbed training steps of the checked model")
    parser.add_argument("--skip-devinterp", action="store_true", help="only our two seeds (null comparison)")
    parser.add_argument("--probe-minibatch-order", action="store_true",
                        help="instead: mean recorded loss of both samplers with minibatches and with full batches")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.probe_minibatch_order:
        probe_minibatch_order(args)
        return

    from datasets import Dataset
    from devinterp.slt.bif import compute_bif as dv_compute_bif
    from devinterp.slt.sampling import sample as dv_sample

    from interp_toolkit.analyses.bif import CoMoments, SamplerConfig
    from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
    from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet, next_token_losses
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.studies.lm.testbed import TestbedConfig, train_testbed
    from interp_toolkit.tasks.induction_corpus import (
        CLASS_NAMES,
        CorpusConfig,
        make_corpus,
        target_classes,
    )

    corpus_cfg = CorpusConfig(n_sequences=1024, seq_len=32, n_ordinary=24, chunk_min=6, chunk_max=12)
    tb = TestbedConfig(corpus=corpus_cfg, total_steps=args.train_steps, linear_every=args.train_steps, batch_size=32)
    ref = train_testbed(tb, args.out / "testbed", progress=False)[-1]
    model = ref.load()
    corpus = make_corpus(corpus_cfg)
    pool = corpus.tokens[: args.n_posterior]
    rec = corpus.tokens[: args.n_rec]
    rec_set = TokenSet(rec, target_classes(corpus.classes[: args.n_rec]), CLASS_NAMES)
    batch = args.n_rec  # devinterp uses one batch size for SGLD minibatches and observables
    T = rec.shape[1] - 1
    n_total = args.chains * args.draws
    runs: dict[str, torch.Tensor] = {}
    seconds: dict[str, float] = {}

    def ours(seed: int) -> torch.Tensor:
        sampler = SamplerConfig(eps=args.eps, gamma=args.gamma, n_beta=args.n_beta, chains=args.chains,
                                draws=args.draws, burn_in=args.burn_in, steps_between_draws=args.steps_between_draws,
                                batch_size=batch, eval_batch_size=batch, keep_draws=True, progress=False, seed=seed)
        return lm_bif(model, pool, rec_set, None, LMBIFConfig(sampler, reductions=("all:all",))).train_draws

    exact = None

    def devinterp(seed: int) -> torch.Tensor:
        nonlocal exact
        pool_ds = Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch")
        rec_ds = Dataset.from_dict({"input_ids": rec.tolist()}).with_format("torch")
        # devinterp counts burn-in and the steps between draws like ours: draw k after
        # burn_in + (k + 1) * steps_between_draws updates (first draw right after burn-in).
        samples = dv_sample(model, pool_ds, {"rec": (rec_ds, 1)}, lr=args.eps, n_beta=args.n_beta,
                            localization=args.gamma, num_chains=args.chains, num_draws=args.draws, batch_size=batch,
                            num_burnin_steps=args.burn_in, num_steps_bw_draws=args.steps_between_draws, device="cpu",
                            loss_fn=next_token_losses, match_sampling_input_ids_across_chains=False, init_seed=seed,
                            output_path=str(args.out / f"dv_samples_{seed}"))
        # devinterp records its observable sequences in a fixed *shuffled* order
        # (DeterministicShuffledSampler): map each of our rows to its devinterp row.
        dv_ids = np.asarray(samples.dataset["input_ids_rec"].values)
        dv_ids = dv_ids.reshape(-1, dv_ids.shape[-1])[-args.n_rec:]
        rows = [int(np.flatnonzero((dv_ids == r.numpy()).all(1))[0]) for r in rec]
        order = torch.tensor(rows)
        draws = torch.from_numpy(np.asarray(samples.dataset["loss_rec"].values, dtype=np.float64))
        draws = draws[:, :, order].reshape(args.chains, args.draws, -1)
        if exact is None:  # 1. our estimator on devinterp's own draws
            def to_matrix(influences) -> torch.Tensor:  # [b1, b2, t1, t2] -> [(b1, t1), (b2, t2)], our row order
                arr = np.asarray(influences.values, dtype=np.float64)[rows][:, rows]
                return torch.from_numpy(arr.transpose(0, 2, 1, 3).reshape(len(rows) * T, len(rows) * T))

            dv_cov = -to_matrix(dv_compute_bif(samples, correlation_method="token", compute_covariance=True,
                                               device="cpu")["influences"]) * (n_total - 1) / n_total
            dv_corr = -to_matrix(dv_compute_bif(samples, correlation_method="token", device="cpu")["influences"])
            dv_avg = -torch.from_numpy(np.asarray(dv_compute_bif(
                samples, correlation_method="token", average_tokenwise_bif=True, device="cpu")["influences"].values,
                dtype=np.float64))[rows][:, rows]
            pooled = CoMoments.from_batch(draws.reshape(n_total, -1), draws.reshape(n_total, -1))
            ours_avg = compute_lm_bif(draws, None, rec_set, None, ("sequence:sequence",), pearson=True,
                                      pearson_convention="token_mean")["sequence:sequence"].bif
            exact = {"max_abs_diff_cov": float((-pooled.covariance() - dv_cov).abs().max()),
                     "max_abs_cov": float(dv_cov.abs().max()),
                     "max_abs_diff_corr": float((-pooled.correlation() - dv_corr).abs().max()),
                     "max_abs_diff_token_mean_pearson": float((ours_avg - dv_avg).abs().max())}
        return draws

    jobs = [("ours_s0", lambda: ours(0)), ("ours_s1", lambda: ours(1))]
    if not args.skip_devinterp:
        jobs += [("devinterp_s100", lambda: devinterp(100)), ("devinterp_s200", lambda: devinterp(200))]
    for name, job in jobs:
        start = time.perf_counter()
        runs[name] = job()
        seconds[name] = time.perf_counter() - start
        print(f"{name}: {seconds[name]:.0f} s", flush=True)

    labels = None

    def estimate(draws: torch.Tensor) -> dict[str, torch.Tensor]:
        nonlocal labels
        red = compute_lm_bif(draws, None, rec_set, None, ("class:class",))["class:class"]
        labels = red.row_labels
        chains = draws.shape[0]
        loo = torch.stack([compute_lm_bif(draws[[c for c in range(chains) if c != d]], None, rec_set, None,
                                          ("class:class",))["class:class"].bif for d in range(chains)])
        jack = ((chains - 1) / chains * (loo - loo.mean(0)).pow(2).sum(0)).sqrt()
        within = red.per_chain.mean(0)  # mean within-chain -Cov
        return {"bif": red.bif, "per_chain": red.stderr, "jackknife": jack,
                "between_share": ((red.bif - within) / red.bif.abs().clamp_min(1e-30))}

    est = {name: estimate(d) for name, d in runs.items()}
    iu = torch.triu_indices(len(labels), len(labels))
    pairs = [("ours_s0", "ours_s1")]
    if not args.skip_devinterp:
        pairs += [("devinterp_s100", "devinterp_s200"), ("ours_s0", "devinterp_s100"), ("ours_s1", "devinterp_s200"),
                  ("ours_s0", "devinterp_s200"), ("ours_s1", "devinterp_s100")]
    table = []
    for x, y in pairs:
        row = {"pair": f"{x} vs {y}"}
        for kind in ("per_chain", "jackknife"):
            z = (est[x]["bif"] - est[y]["bif"]) / (est[x][kind] ** 2 + est[y][kind] ** 2).sqrt().clamp_min(1e-30)
            zu = z[iu[0], iu[1]]
            row[f"max_abs_z_{kind}"] = float(zu.abs().max())
            row[f"rms_z_{kind}"] = float(zu.pow(2).mean().sqrt())
            row[f"frac_abs_z_gt_2_{kind}"] = float((zu.abs() > 2).double().mean())
            row[f"z_{kind}"] = z.tolist()
        table.append(row)
    report = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "n_recorded_tokens": rec_set.n_tokens, "seconds": seconds, "estimator_on_devinterp_draws": exact,
        "class_labels": labels,
        "class_bif": {k: v["bif"].tolist() for k, v in est.items()},
        "se_ratio_jackknife_over_per_chain": {k: float((v["jackknife"] / v["per_chain"])[iu[0], iu[1]].median())
                                              for k, v in est.items()},
        "between_chain_share_median": {k: float(v["between_share"][iu[0], iu[1]].median()) for k, v in est.items()},
        "mean_loss": {k: float(v.mean()) for k, v in runs.items()},
        "z_table": table,
    }
    atomic_write_json(args.out / "crosscheck.json", report)
    print(json.dumps({"estimator_on_devinterp_draws": exact, "mean_loss": report["mean_loss"],
                      "se_ratio_jackknife_over_per_chain": report["se_ratio_jackknife_over_per_chain"],
                      "between_chain_share_median": report["between_chain_share_median"]}, indent=1))
    print(f"{'pair':>34} | {'max|z| chain':>12} {'rms z':>6} {'>2':>5} | {'max|z| jack':>11} {'rms z':>6} {'>2':>5}")
    for row in table:
        print(f"{row['pair']:>34} | {row['max_abs_z_per_chain']:12.2f} {row['rms_z_per_chain']:6.2f} "
              f"{row['frac_abs_z_gt_2_per_chain']:5.2f} | {row['max_abs_z_jackknife']:11.2f} "
              f"{row['rms_z_jackknife']:6.2f} {row['frac_abs_z_gt_2_jackknife']:5.2f}")
    print(f"wrote {args.out / 'crosscheck.json'}")


def probe_minibatch_order(args: argparse.Namespace) -> None:
    """Mean recorded loss, ours vs devinterp, with minibatches of 16 and with the full pool.

    devinterp's ``epoch_mode="cycle"`` (``itertools.cycle`` over the DataLoader) replays the
    first epoch's shuffled minibatch order for the whole chain; ours draws a fresh
    permutation every epoch. With full batches the order cannot matter, so a mean-loss
    offset that appears with minibatches and vanishes with full batches comes from it.
    """
    from datasets import Dataset
    from devinterp.slt.sampling import sample as dv_sample

    from interp_toolkit.analyses.bif import SamplerConfig
    from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet, next_token_losses
    from interp_toolkit.studies.lm.testbed import TestbedConfig, train_testbed
    from interp_toolkit.tasks.induction_corpus import CorpusConfig, make_corpus

    corpus_cfg = CorpusConfig(n_sequences=1024, seq_len=32, n_ordinary=24, chunk_min=6, chunk_max=12)
    tb = TestbedConfig(corpus=corpus_cfg, total_steps=args.train_steps, linear_every=args.train_steps, batch_size=32)
    model = train_testbed(tb, args.out / "testbed", progress=False)[-1].load()
    pool = make_corpus(corpus_cfg).tokens[: args.n_posterior]
    out = {}
    for batch in (16, args.n_posterior):
        sampler = SamplerConfig(eps=args.eps, gamma=args.gamma, n_beta=args.n_beta, chains=args.chains,
                                draws=args.draws, burn_in=args.burn_in, batch_size=batch, eval_batch_size=batch,
                                keep_draws=True, progress=False)
        ours = lm_bif(model, pool, TokenSet(pool), None, LMBIFConfig(sampler, reductions=("all:all",))).train_draws
        ds = Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch")
        samples = dv_sample(model, ds, {"rec": (ds, args.n_posterior // batch)}, lr=args.eps, n_beta=args.n_beta,
                            localization=args.gamma, num_chains=args.chains, num_draws=args.draws, batch_size=batch,
                            num_burnin_steps=args.burn_in, device="cpu", loss_fn=next_token_losses,
                            match_sampling_input_ids_across_chains=False,
                            output_path=str(args.out / f"dv_probe_{batch}"))
        theirs = torch.from_numpy(np.asarray(samples.dataset["loss_rec"].values, dtype=np.float64))
        for name, draws in (("ours", ours), ("devinterp", theirs)):
            per_chain = draws.reshape(draws.shape[0], -1).mean(1)
            out[f"{name}_batch{batch}"] = {"mean_loss": float(per_chain.mean()),
                                           "stderr": float(per_chain.std() / per_chain.numel() ** 0.5)}
        print(json.dumps({k: v for k, v in out.items() if k.endswith(f"batch{batch}")}), flush=True)
    from interp_toolkit.io import atomic_write_json

    atomic_write_json(args.out / "minibatch_order_probe.json", {"settings": {k: str(v) for k, v in vars(args).items()},
                                                               "results": out})


if __name__ == "__main__":
    main()
