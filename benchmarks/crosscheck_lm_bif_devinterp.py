"""Cross-check of the token-level BIF against ``devinterp`` 2.0.1 (Timaeus) ``bif()``.

Same model (a briefly trained testbed GPTNeoX, loaded through ``boot_transformers``), same
data (SGLD pool: the first ``--n-posterior`` corpus sequences; recorded set: ``--n-rec``
sequences), same SGLD settings (``lr = eps``, ``localization = gamma``, ``n_beta``, chains,
draws, burn-in, minibatch) and the same per-token loss function.

Conventions: devinterp returns ``+Corr`` (default) or ``+Cov`` with the unbiased ``1/(N-1)``
normalization over the pooled ``chains x draws`` draws; ours is ``-Cov`` with ``1/N`` (or
``-Corr``). So ``ours = -devinterp_cov x (N - 1) / N`` and ``ours_pearson = -devinterp_corr``.

Two checks:

1. **Estimator, exact**: our estimator applied to devinterp's *own stored draws* must
   reproduce devinterp's matrix to float32 rounding (covariance and correlation).
2. **Sampler, statistical**: the two samplers use different random streams (devinterp
   seeds torch's global RNG and its own data loader; ours uses per-chain generators and
   ``randperm`` minibatches), so the estimates can only agree within sampling noise.
   devinterp runs with ``match_sampling_input_ids_across_chains=False`` so that its chains
   are independent like ours (standard errors across chains assume that). We
   report the correlation of the two matrices' entries and z-scores
   ``(ours - aligned devinterp) / sqrt(se_ours^2 + se_devinterp^2)`` (standard errors
   across chains) for the full token matrix and its token-class reduction.

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
    parser.add_argument("--eps", type=float, default=1e-4)
    parser.add_argument("--gamma", type=float, default=100.0)
    parser.add_argument("--n-beta", type=float, default=30.0)
    parser.add_argument("--train-steps", type=int, default=300, help="testbed training steps of the checked model")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from datasets import Dataset
    from devinterp.slt.bif import compute_bif as dv_compute_bif
    from devinterp.slt.sampling import sample as dv_sample

    from interp_toolkit.analyses.bif import CoMoments, SamplerConfig
    from interp_toolkit.analyses.bif.lm import (
        LMBIFConfig,
        TokenSet,
        group_ids,
        lm_bif,
        next_token_losses,
        reduce_matrix,
    )
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.studies.lm_testbed import TestbedConfig, train_testbed
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

    # --- ours
    sampler = SamplerConfig(eps=args.eps, gamma=args.gamma, n_beta=args.n_beta, chains=args.chains, draws=args.draws,
                            burn_in=args.burn_in, batch_size=batch, eval_batch_size=batch, keep_draws=True,
                            progress=False)
    start = time.perf_counter()
    ours = lm_bif(model, pool, rec_set, None, LMBIFConfig(sampler, reductions=("token:token", "class:class")))
    ours_s = time.perf_counter() - start

    # --- devinterp
    pool_ds = Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch")
    rec_ds = Dataset.from_dict({"input_ids": rec.tolist()}).with_format("torch")
    start = time.perf_counter()
    samples = dv_sample(model, pool_ds, {"rec": (rec_ds, 1)}, lr=args.eps, n_beta=args.n_beta,
                        localization=args.gamma, num_chains=args.chains, num_draws=args.draws, batch_size=batch,
                        num_burnin_steps=args.burn_in, num_steps_bw_draws=1, device="cpu",
                        loss_fn=next_token_losses, match_sampling_input_ids_across_chains=False)
    dv_cov = dv_compute_bif(samples, correlation_method="token", compute_covariance=True, device="cpu")
    dv_s = time.perf_counter() - start
    dv_corr = dv_compute_bif(samples, correlation_method="token", device="cpu")

    # devinterp records its observable sequences in a fixed *shuffled* order
    # (DeterministicShuffledSampler): map each of our rows to its devinterp row.
    dv_ids = np.asarray(samples.dataset["input_ids_rec"].values)
    dv_ids = dv_ids.reshape(-1, dv_ids.shape[-1])[-args.n_rec:]
    rows = [int(np.flatnonzero((dv_ids == r.numpy()).all(1))[0]) for r in rec]
    order = torch.tensor(rows)

    def to_matrix(influences) -> torch.Tensor:  # [b1, b2, t1, t2] -> [(b1, t1), (b2, t2)], our row order
        arr = np.asarray(influences.values, dtype=np.float64)[rows][:, rows]
        n1, n2 = arr.shape[:2]
        return torch.from_numpy(arr.transpose(0, 2, 1, 3).reshape(n1 * T, n2 * T))

    loss_var = [v for v in samples.dataset.data_vars if str(v).startswith("loss_rec")][0]
    dv_draws = torch.from_numpy(np.asarray(samples.dataset[loss_var].values, dtype=np.float64))  # chain, draw, batch, pos
    dv_draws = dv_draws[:, :, order].reshape(args.chains, args.draws, -1)
    n_total = args.chains * args.draws

    # 1. estimator on devinterp's own draws
    pooled = CoMoments.from_batch(dv_draws.reshape(n_total, -1), dv_draws.reshape(n_total, -1))
    ours_on_dv_cov = -pooled.covariance()
    ours_on_dv_corr = -pooled.correlation()
    dv_cov_aligned = -to_matrix(dv_cov["influences"]) * (n_total - 1) / n_total
    dv_corr_aligned = -to_matrix(dv_corr["influences"])
    scale = float(dv_cov_aligned.abs().max())
    exact = {
        "max_abs_diff_cov": float((ours_on_dv_cov - dv_cov_aligned).abs().max()),
        "max_abs_cov": scale,
        "max_abs_diff_corr": float((ours_on_dv_corr - dv_corr_aligned).abs().max()),
    }

    # 2. sampler agreement within noise
    def per_chain_cov(draws: torch.Tensor) -> torch.Tensor:
        return torch.stack([-CoMoments.from_batch(d, d).covariance() for d in draws])

    def se(per_chain: torch.Tensor) -> torch.Tensor:
        return per_chain.std(0) / per_chain.shape[0] ** 0.5

    ours_full = ours["token:token"].bif
    ours_se = ours["token:token"].stderr
    dv_pc = per_chain_cov(dv_draws)
    dv_se = se(dv_pc)
    z = (ours_full - dv_cov_aligned) / torch.sqrt(ours_se**2 + dv_se**2).clamp_min(1e-30)
    ids, labels = group_ids(rec_set, "class")
    ours_cls = ours["class:class"]
    dv_cls = reduce_matrix(dv_cov_aligned, ids, ids)
    dv_cls_se = se(torch.stack([reduce_matrix(m, ids, ids) for m in dv_pc]))
    z_cls = (ours_cls.bif - dv_cls) / torch.sqrt(ours_cls.stderr**2 + dv_cls_se**2).clamp_min(1e-30)
    # noise floor: how well do two halves of *our own* chains agree?
    half = args.chains // 2
    if half >= 1:
        own = ours.train_draws
        a = -CoMoments.from_batch(own[:half].reshape(-1, own.shape[-1]), own[:half].reshape(-1, own.shape[-1])).covariance()
        b = -CoMoments.from_batch(own[half:].reshape(-1, own.shape[-1]), own[half:].reshape(-1, own.shape[-1])).covariance()
        own_split_corr = float(np.corrcoef(a.ravel(), b.ravel())[0, 1])
    else:
        own_split_corr = float("nan")
    report = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "n_recorded_tokens": rec_set.n_tokens,
        "devinterp_row_of_ours": rows,
        "seconds": {"ours": ours_s, "devinterp": dv_s},
        "estimator_on_devinterp_draws": exact,
        "sampler_agreement": {
            "token_matrix_entry_correlation": float(np.corrcoef(ours_full.ravel(), dv_cov_aligned.ravel())[0, 1]),
            "own_half_chains_entry_correlation": own_split_corr,
            "token_fraction_abs_z_below_2": float((z.abs() < 2).double().mean()),
            "token_median_abs_z": float(z.abs().median()),
            "class_labels": labels,
            "class_ours": ours_cls.bif.tolist(),
            "class_devinterp_aligned": dv_cls.tolist(),
            "class_z": z_cls.tolist(),
            "mean_loss_ours": float(ours.train_mean_loss.mean()),
            "mean_loss_devinterp": float(dv_draws.mean()),
        },
    }
    atomic_write_json(args.out / "crosscheck.json", report)
    print(json.dumps({"estimator_on_devinterp_draws": exact,
                      **{k: v for k, v in report["sampler_agreement"].items() if not k.startswith("class_")},
                      "class_z": [[round(x, 2) for x in row] for row in report["sampler_agreement"]["class_z"]]},
                     indent=1))
    print(f"wrote {args.out / 'crosscheck.json'}")


if __name__ == "__main__":
    main()
