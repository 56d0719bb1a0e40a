"""High-level :func:`bif`: per-example losses and observables through the one engine
(:func:`~.engine.stream_tables`), with diagnostics and a cache."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from interp_toolkit.errors import UserError
from interp_toolkit.io import config_hash
from interp_toolkit.plotting import save_figure

from .config import SamplerConfig
from .data import (
    DataLike,
    LossFn,
    Observable,
    data_fingerprint,
    model_fingerprint,
    per_example_losses,
)
from .diagnostics import ADVICE, convergence_diagnostics, tracked_indices
from .engine import StreamedTable, stream_tables
from .groups import check_groups, trace_bif
from .locality import LOCALITY_ADVICE, locality_of
from .plots import plot_bif, plot_diagnostics
from .results import BIFResult, Draws

# --------------------------------------------------------------------------- high level


def bif(
    model: nn.Module,
    train_data: DataLike,
    query_data: DataLike | None,
    loss_fn: LossFn,
    config: SamplerConfig,
    *,
    attribution_data: DataLike | None = None,
    attribution_fn: Observable | None = None,
    observables: Mapping[str, Observable] | None = None,
    phase_fn: Callable[[nn.Module], int] | None = None,
    cache_dir: str | Path | None = None,
    cache_tag: str | None = None,
    callbacks: Sequence[Any] | None = None,
    reference_loss: float | None = None,
    reference: str = "reference loss",
    accuracy_fn: LossFn | None = None,
    advice: str = ADVICE,
    row_groups: Mapping[str, Tensor] | None = None,
) -> BIFResult:
    """Bayesian influence of training examples on observables at the model's checkpoint.

    Args:
        model: Any module; its current weights are the localization centre ``w*``
            (restored afterwards).
        train_data: Examples defining the posterior (``L_n``); by default also the
            attribution set.
        query_data: Examples whose per-example losses are the default observables
            (``"query_loss"``); may be ``None`` if ``observables`` is given.
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        config: Sampler settings (also ``keep_draws`` and ``pearson``).
        attribution_data: Attribution set (rows of the result); default ``train_data``.
        attribution_fn: Override the attribution values per draw (``model -> tensor``),
            e.g. per-token losses; default: per-example losses of ``attribution_data``.
        observables: Extra ``name -> (model -> tensor)`` observables (columns), after
            ``"query_loss"`` if ``query_data`` is given.
        phase_fn: ``model -> int`` phase label evaluated at every draw; adds a streaming
            :class:`PhaseDecomposition`. Label draws by solution with
            :func:`observable_phase_fn` (e.g. ``studies.bif.dln.mode_phase_fn``); to compare a
            between-phase share with its Gaussian null use ``keep_draws=True`` and
            :func:`phase_share_with_null` (:func:`cluster_phases` splits any posterior,
            phases or not: its null share is about ``2/pi``).
        cache_dir: If given, results are stored under ``cache_dir/bif_<hash>/`` keyed by
            the config, model weights, data, loss/observable names and ``cache_tag``; a
            rerun with the same key loads the stored result. PNG figures are written beside.
        cache_tag: Extra cache-key text (the bodies of callables are not hashed; change the
            tag when you change a loss or observable function but keep its name).
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects told of every SGLD
            draw and chain end (see :func:`sample_sgld`); not part of the cache key.
        reference_loss: The posterior data's loss once the solution is gone (chance: the
            label-marginal cross-entropy :func:`~.locality.label_marginal_loss`, the unigram
            loss of a language model): the locality gate (:mod:`.locality`) measures how much
            of the gap from the checkpoint's loss to it the draws climbed. Without it the
            climb is unmeasured and the result is never ``converged and local``.
        reference: What ``reference_loss`` is, for messages.
        accuracy_fn: ``(model, batch) -> Tensor[batch]`` per-example correctness, for
            classifiers: the draws' accuracy on the posterior data beside the checkpoint's.
        advice: What a convergence warning recommends (a command passes its own ``--calibrate``).
        row_groups: ``name -> boolean mask`` over the attribution rows: ``result.group_means``
            then holds each group's mean BIF on each observable's mean, with its
            leave-one-chain-out jackknife error (from the group's mean-loss trace:
            :func:`~.groups.trace_bif`; a mean of per-entry errors would not be its error).

    Returns:
        The :class:`BIFResult` with diagnostics: the sampler's loss and distance traces, and
        :class:`~interp_toolkit.analyses.bif.diagnostics.ConvergenceDiagnostics` (split R-hat,
        bulk/tail ESS and between-chain share of up to 16 x 16 evenly spaced entries, from
        their per-draw values: ``chains x draws x 32`` numbers, not the draws). When R-hat >
        1.01 or an ESS < 100 a warning names the settings to change and
        ``result.convergence.converged`` is False. ``result.locality`` holds the locality
        numbers, ``result.verdict`` the joint label (``converged and local``, ``converged,
        not local`` or ``not converged``); a non-local result warns too.
    """
    if not isinstance(config, SamplerConfig):
        raise TypeError(f"config must be a SamplerConfig, got {type(config).__name__}")
    if query_data is None and not observables:
        raise UserError("give query_data or at least one observable")
    attribution_data = train_data if attribution_data is None else attribution_data
    recorders: dict[str, Observable] = {}
    # Query set == attribution set (same object): record the losses once per draw.
    query_is_attribution = query_data is not None and query_data is attribution_data and attribution_fn is None
    if query_data is not None:
        recorders["query_loss"] = per_example_losses(loss_fn, query_data, config.eval_batch_size)
    for name, fn in (observables or {}).items():
        if name in recorders or name == "__attribution__":
            raise UserError(f"observable name {name!r} is reserved or duplicated")
        recorders[name] = fn
    attribution = attribution_fn or per_example_losses(loss_fn, attribution_data, config.eval_batch_size)
    if row_groups is not None and config.pearson:
        raise UserError("row_groups needs covariances (pearson=False): a group mean of correlations is not the "
                        "correlation of the group's mean loss")

    key = None
    if cache_dir is not None:
        identity = {
            "sampler": {k: v for k, v in config.to_dict().items() if k != "progress"},
            "model": model_fingerprint(model),
            "train": data_fingerprint(train_data),
            "query": data_fingerprint(query_data),
            "attribution": data_fingerprint(attribution_data) if attribution_fn is None else _qualname(attribution_fn),
            "loss_fn": _qualname(loss_fn),
            "observables": {k: _qualname(v) for k, v in (observables or {}).items()},
            "phase_fn": _qualname(phase_fn) if phase_fn is not None else None,
            "tag": cache_tag,
        }
        if row_groups is not None:
            identity["row_groups"] = {k: data_fingerprint(torch.as_tensor(v)) for k, v in row_groups.items()}
        if reference_loss is not None or accuracy_fn is not None:  # (absent: the keys of earlier results)
            identity["locality"] = {"reference_loss": reference_loss, "reference": reference,
                                    "accuracy_fn": None if accuracy_fn is None else _qualname(accuracy_fn)}
        key = config_hash(identity)
        out_dir = Path(cache_dir) / f"bif_{key}"
        if BIFResult.is_stored(out_dir):
            return BIFResult.load(out_dir)

    # One probing pass at w* (it also checks the observables run before any sampling);
    # the query losses are not evaluated separately when they are the attribution losses.
    with torch.inference_mode():
        probe_a = attribution(model)
        sizes = {k: int(probe_a.numel()) if query_is_attribution and k == "query_loss" else int(fn(model).numel())
                 for k, fn in recorders.items()}
    n_a = int(probe_a.numel())
    groups = check_groups(row_groups, n_a) if row_groups is not None else {}
    # Raw draws keep the recorded dtype (float64 stays float64, so compute_bif on them
    # reproduces the streamed estimate to rounding). The n_a x n_b co-moments are
    # accumulated in that dtype too: float32 halves the memory, and accumulating centred
    # batches keeps it accurate (see CoMoments).
    kept_dtype = torch.float64 if probe_a.dtype == torch.float64 else torch.float32
    del probe_a
    slices, start = {}, 0
    for name, size in sizes.items():
        slices[name] = (start, start + size)
        start += size
    n_b = start
    # Draws are merged in blocks: one matrix product per block instead of one rank-one
    # update per draw (faster, and float32-friendly). A block is at most this many draws.
    block = max(1, min(64, (32 * 2**20) // max(1, 8 * (n_a + n_b))))
    # Without phases the chains' co-moments are the rows of one [chains, n_a, n_b] tensor
    # that the estimator turns into the per-chain estimates in place (no copy).
    table = StreamedTable("__attribution__", "__observables__", (n_a, n_b), dtype=kept_dtype, block=block,
                          in_place=True)
    kept_a = torch.zeros(config.chains, config.draws, n_a, dtype=kept_dtype) if config.keep_draws else None
    kept_b = torch.zeros(config.chains, config.draws, n_b, dtype=kept_dtype) if config.keep_draws else None
    kept_labels = (
        torch.zeros(config.chains, config.draws, dtype=torch.long) if config.keep_draws and phase_fn else None
    )
    # per-draw values of a few rows / columns (and scalar summaries) for the diagnostics
    rows, cols = tracked_indices(n_a), tracked_indices(n_b)
    tracked_a = torch.zeros(config.chains, config.draws, len(rows), dtype=torch.float64)
    tracked_b = torch.zeros(config.chains, config.draws, len(cols), dtype=torch.float64)
    scalar_traces = {name: torch.zeros(config.chains, config.draws, dtype=torch.float64)
                     for name in ["mean attribution loss", *(f"mean {k}" for k in recorders)]}
    group_traces = {name: torch.zeros(config.chains, config.draws, dtype=torch.float64) for name in groups}
    all_recorders = {"__attribution__": attribution, **recorders}
    if query_is_attribution:
        del all_recorders["query_loss"]

    def on_draw(chain: int, draw: int, values: dict[str, Tensor], label: int) -> None:
        a = values["__attribution__"]
        if query_is_attribution:
            values["query_loss"] = a
        b = torch.cat([values[name] for name in recorders]) if len(recorders) > 1 else values[next(iter(recorders))]
        if a.numel() != n_a or b.numel() != n_b:
            raise UserError(f"recorded sizes changed between draws: {a.numel()}/{n_a}, {b.numel()}/{n_b}")
        values["__observables__"] = b
        tracked_a[chain, draw] = a[rows]
        tracked_b[chain, draw] = b[cols]
        scalar_traces["mean attribution loss"][chain, draw] = a.mean()
        for name, mask in groups.items():
            group_traces[name][chain, draw] = a[mask].mean()
        for name, (start, stop) in slices.items():
            scalar_traces[f"mean {name}"][chain, draw] = b[start:stop].mean()
        if kept_a is not None and kept_b is not None:  # both or neither (config.keep_draws)
            kept_a[chain, draw] = a.to(kept_dtype)
            kept_b[chain, draw] = b.to(kept_dtype)
        if kept_labels is not None:
            kept_labels[chain, draw] = label

    estimates, diagnostics = stream_tables(model, train_data, loss_fn, config, all_recorders, {"bif": table},
                                           phase_fn=phase_fn, on_draw=on_draw, callbacks=callbacks,
                                           accuracy_fn=accuracy_fn)
    estimate = estimates["bif"]
    if diagnostics.distance_trace is not None:
        at_draws = (
            torch.arange(config.draws) * config.steps_between_draws + config.burn_in + config.steps_between_draws - 1
        )
        scalar_traces["distance from w*"] = diagnostics.distance_trace[:, at_draws]
    convergence = convergence_diagnostics(
        tracked_a, tracked_b, rows, cols, per_chain=estimate.per_chain[:, rows][:, :, cols], scalars=scalar_traces,
        advice=advice)
    for note in convergence.warnings:
        warnings.warn(f"BIF not converged: {note}", stacklevel=2)
    group_means = {group: {name: trace_bif(trace, scalar_traces[f"mean {name}"]) for name in slices}
                   for group, trace in group_traces.items()}
    locality = locality_of(diagnostics, config, reference_loss, reference)
    if not locality.local and reference_loss is not None:  # (unmeasured: result.locality says so)
        warnings.warn(f"BIF not local: {'; '.join(locality.failed)}; {LOCALITY_ADVICE}", stacklevel=2)
    result = BIFResult(
        bif=estimate.bif,
        stderr=estimate.stderr,
        per_chain=estimate.per_chain,
        per_chain_stderr=estimate.per_chain_stderr,
        convergence=convergence,
        pearson=config.pearson,
        chains=config.chains,
        draws_per_chain=config.draws,
        attribution_mean=estimate.attribution_mean,
        observable_mean=estimate.observable_mean,
        observable_slices=slices,
        phases=estimate.phases,
        diagnostics=diagnostics,
        draws=Draws(kept_a, kept_b, dict(slices), phase_labels=kept_labels)
        if kept_a is not None and kept_b is not None else None,
        config=config.to_dict(),
        cache_key=key,
        locality=locality,
        group_means=group_means or None,
    )
    if cache_dir is not None:
        out_dir = Path(cache_dir) / f"bif_{key}"
        save_figure(plot_bif(result), out_dir / "bif.png")
        save_figure(plot_diagnostics(diagnostics.loss_trace, diagnostics.distance_trace, convergence,
                                     burn_in=config.burn_in, locality=locality), out_dir / "diagnostics.png")
        result.save(out_dir)
    return result


def _qualname(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__

