"""Bayesian influence functions (BIF) from SGLD draws of a localized posterior.

The Bayesian influence of a training example ``z_i`` on an observable ``phi`` is

    BIF(z_i, phi) = -Cov_{p(w | D)}(loss_i(w), phi(w)),

the first-order change of the posterior expectation of ``phi`` when ``z_i`` is up-weighted
(``d/d eps E[phi]`` under ``p(w) * exp(-eps * loss_i(w))``). For a loss observable a
*negative* BIF therefore means "training on z_i lowers the query loss" (helpful).
It needs no Hessian inverse and is defined at every checkpoint of a run.

The posterior is localized at a checkpoint ``w*`` and tempered:

    p(w) ∝ exp(-n·beta · L_n(w) - gamma/2 · ||w - w*||^2),

and sampled by SGLD (:func:`sample_sgld`, whose update is the reusable step :class:`SGLD`)::

    w <- w - (eps/2) (n·beta · grad L_batch(w) + gamma (w - w*)) + N(0, eps).

Two levels of API:

* :func:`bif` (high level): sample, record per-example losses of an attribution set and any
  observables at every draw, accumulate means and co-moments on the fly (memory
  ``O(chains x n_train x n_query)``, independent of the number of draws), return a
  :class:`BIFResult`; optionally cached by config hash under ``cache_dir``.
* :func:`compute_bif` (low level): the same estimator on stored draws (:class:`Draws`).

Every covariance here is the population covariance over draws (divide by the number of
draws, not minus one), so that the phase decomposition (within-phase + between-phase)
adds up *exactly* to the total. The standard error of each entry is the leave-one-chain-out
jackknife of the pooled estimate (NaN with one chain); the spread of the per-chain estimates
divided by ``sqrt(chains)`` stays available as ``per_chain_stderr`` (it misses the part of the
pooled covariance that comes from chains that sit at different places). Every result carries
convergence diagnostics (:mod:`.diagnostics`: split R-hat, bulk/tail ESS, between-chain share)
and warns when they fail.

Generic by design (token-level BIF for language models builds on it): the model is any
``torch.nn.Module``; the data is a tensor, a tuple/list of tensors or a dict of tensors
indexed along dim 0; ``loss_fn(model, batch)`` returns per-example losses (any trailing
dims, e.g. per token, are flattened when recorded and averaged for the SGLD gradient);
observables are callables ``model -> tensor`` (flattened).

Package layout (one concern per module): :mod:`.config` (settings), :mod:`.data` (data
helpers), :mod:`.sampler` (SGLD), :mod:`.engine` (the one engine both front ends use: draws
streamed into co-moment tables, then estimated), :mod:`.moments` (streaming co-moments), :mod:`.results`
(result types, save/load), :mod:`.estimator` (the estimator on accumulators or stored draws),
:mod:`.sgld` (the SGLD update as a reusable step), :mod:`.diagnostics` (R-hat, ESS, the
convergence verdict), :mod:`.locality` (whether the draws still solve the task: the locality
gate beside convergence), :mod:`.localize` (gamma and eps per checkpoint), :mod:`.adaptive` (chains doubled
until they converge or a budget runs out: ``until_converged(partial(bif, model, train,
query, loss_fn), config, AdaptiveConfig())``), :mod:`.calibration` (sampler sweeps of any
loss function), :mod:`.phases` (phase labels by solution or clustering, between-phase shares with their Gaussian null),
:mod:`.api` (high-level :func:`bif`), :mod:`.plots`,
:mod:`.lm` (token-level BIF for language models; its token sets and reductions in
:mod:`.lm_tokens`, its estimator from stored draws in :mod:`.lm_estimate`), :mod:`.claims`
(class-to-class influences: the language-model claims, with errors and diagnostics),
:mod:`.token_classes` (delimiter, induction and user token classes on any tokenized text),
:mod:`.validation` (leave-one-out and causal-window checks on the deep linear network).
"""

from __future__ import annotations

from interp_toolkit.lazy import lazy_exports

# public name -> submodule (imported on first access, so that the CLI can read
# ``SamplerConfig`` without importing torch)
_EXPORTS = {
    "bif": ".api",
    "AdaptiveConfig": ".adaptive",
    "AdaptiveRecord": ".adaptive",
    "until_converged": ".adaptive",
    "convergence_label": ".plots",
    "SamplerConfig": ".config",
    "LocalizeConfig": ".config",
    "Locality": ".locality",
    "measure_locality": ".locality",
    "sampling_verdict": ".locality",
    "label_marginal_loss": ".locality",
    "unigram_loss": ".locality",
    "LocalGamma": ".localize",
    "local_gamma": ".localize",
    "top_curvature": ".localize",
    "trace_bif": ".groups",
    "SamplerDivergenceError": ".config",
    "data_length": ".data",
    "index_data": ".data",
    "per_example_losses": ".data",
    "compute_bif": ".estimator",
    "BIFEstimate": ".estimator",
    "estimate_from_moments": ".estimator",
    "StreamedTable": ".engine",
    "stream_tables": ".engine",
    "CoMoments": ".moments",
    "cluster_phases": ".phases",
    "PhaseShare": ".phases",
    "between_share": ".phases",
    "gaussian_null_draws": ".phases",
    "observable_phase_fn": ".phases",
    "phase_share_with_null": ".phases",
    "threshold_phases": ".phases",
    "plot_bif": ".plots",
    "plot_diagnostics": ".plots",
    "ClassInfluence": ".claims",
    "class_influence": ".claims",
    "claim_influences": ".claims",
    "Calibration": ".calibration",
    "calibrate_sampler": ".calibration",
    "plot_calibration": ".calibration",
    "ConvergenceDiagnostics": ".diagnostics",
    "convergence_diagnostics": ".diagnostics",
    "split_rhat": ".diagnostics",
    "ess_bulk": ".diagnostics",
    "ess_tail": ".diagnostics",
    "BIFResult": ".results",
    "Draws": ".results",
    "PhaseDecomposition": ".results",
    "SamplerDiagnostics": ".sampler",
    "sample_sgld": ".sampler",
    "SGLD": ".sgld",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
