"""The one BIF engine: SGLD draws streamed into co-moment tables, then estimated.

Every Bayesian influence the toolkit computes is ``-Cov`` (or ``-Corr``) over the draws of a
localized posterior between two vectors recorded at every draw. :func:`stream_tables` runs
the sampler (:func:`~.sampler.sample_sgld`, whose update is the reusable step
:class:`~.sgld.SGLD`), converts the recorded values once per draw, lets the caller add what
it derives from them (group means, a concatenation) and keep what it wants (traces, draws),
streams every :class:`StreamedTable` into per-(chain, phase) :class:`~.moments.CoMoments`, and
returns one :class:`~.estimator.BIFEstimate` per table (pooled estimate, leave-one-chain-out
jackknife error, per-chain estimates, phase decomposition).

The two public front ends are thin: :func:`~.api.bif` records per-example losses and
observables into one table; :func:`~.lm.lm_bif` records per-token losses and streams one
table per reduction of the token matrix (group means of the train and query tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from interp_toolkit.errors import UserError

from .config import SamplerConfig
from .data import DataLike, LossFn, Observable
from .estimator import BIFEstimate, estimate_from_moments
from .moments import CoMoments
from .sampler import SamplerDiagnostics, sample_sgld

#: ``on_draw(chain, draw, values, phase_label)``: called at every draw before the tables are
#: updated; ``values`` holds every recorder's flattened values as CPU float64 and may be
#: extended in place with derived entries that tables read.
DrawHook = Callable[[int, int, dict[str, Tensor], int], None]

STDERR_METHODS = ("jackknife", "per_chain")


@dataclass(frozen=True)
class StreamedTable:
    """One ``-Cov`` (or ``-Corr``) table the engine streams.

    Attributes:
        rows: The entry of the per-draw values holding the table's row vector (``n_a``).
        cols: The entry holding its column vector (``n_b``).
        shape: ``(n_a, n_b)``; a draw whose vectors have other sizes is refused.
        dtype: Dtype of the co-moment matrix (float32 halves the only large tensor; every
            update adds centred products, so it stays accurate: see :class:`CoMoments`).
        block: Draws merged per update: ``1`` is Welford's rank-one update per draw; more
            merge a block with one matrix product (faster for large tables).
        in_place: Without phases, hold the chains' co-moments as the rows of one
            ``[chains, n_a, n_b]`` tensor that the estimator turns into the per-chain
            estimates in place (no copy of the largest tensor).
    """

    rows: str
    cols: str
    shape: tuple[int, int]
    dtype: torch.dtype = torch.float64
    block: int = 1
    in_place: bool = False

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise UserError(f"StreamedTable.shape must be (n_a, n_b) with both >= 1, got {self.shape!r}")
        if self.block < 1:
            raise UserError(f"StreamedTable.block must be >= 1, got {self.block!r}")


def stream_tables(
    model: nn.Module,
    posterior: DataLike,
    loss_fn: LossFn,
    sampler: SamplerConfig,
    recorders: Mapping[str, Observable],
    tables: Mapping[str, StreamedTable],
    *,
    phase_fn: Callable[[nn.Module], int] | None = None,
    on_draw: DrawHook | None = None,
    callbacks: Sequence[Any] | None = None,
    accuracy_fn: LossFn | None = None,
) -> tuple[dict[str, BIFEstimate], SamplerDiagnostics]:
    """Sample the localized posterior around ``model``'s weights and estimate every table.

    Args:
        model: Any module; its current weights are ``w*`` (restored afterwards).
        posterior: The data of ``L_n`` (SGLD minibatches).
        loss_fn: Per-example (or per-token) losses; their mean is the SGLD loss.
        sampler: Sampler settings (``chains``, ``draws``, ``pearson``, ...).
        recorders: ``name -> (model -> tensor)`` evaluated at every draw.
        tables: ``name -> StreamedTable`` to stream; their ``rows``/``cols`` name recorders or
            entries that ``on_draw`` adds.
        phase_fn: ``model -> int`` label of every draw; each table is then accumulated per
            (chain, label) and its estimate carries the within/between decomposition.
        on_draw: Called at every draw before the tables are updated (see :data:`DrawHook`).
        callbacks: :class:`interp_toolkit.callbacks.Callback` objects of the sampler.
        accuracy_fn: Per-example correctness on the posterior data (classifiers), recorded at
            every draw for the locality gate (see :func:`~.sampler.sample_sgld`).

    Returns:
        ``(name -> BIFEstimate, sampler diagnostics)``.
    """
    chains = sampler.chains
    accumulators: dict[str, dict[tuple[int, int], CoMoments]] = {name: {} for name in tables}
    storage: dict[str, Tensor] = {}
    pending: dict[tuple[str, int, int], tuple[list[Tensor], list[Tensor]]] = {}

    def accumulator(name: str, slot: tuple[int, int]) -> CoMoments:
        acc = accumulators[name].get(slot)
        if acc is None:
            table, out = tables[name], None
            if table.in_place and phase_fn is None:
                if name not in storage:
                    storage[name] = torch.zeros(chains, *table.shape, dtype=table.dtype)
                out = storage[name][slot[0]]
            acc = accumulators[name][slot] = CoMoments(*table.shape, dtype=table.dtype, out=out)
        return acc

    def flush(key: tuple[str, int, int]) -> None:
        rows, cols = pending.pop(key)
        accumulator(key[0], key[1:]).update_batch(torch.stack(rows), torch.stack(cols))

    def record(chain: int, draw: int, raw: dict[str, Tensor]) -> None:
        values = {name: value.to("cpu", torch.float64) for name, value in raw.items()}
        label = 0 if phase_fn is None else int(phase_fn(model))
        if on_draw is not None:
            on_draw(chain, draw, values, label)
        for name, table in tables.items():
            a, b = values[table.rows], values[table.cols]
            if (a.numel(), b.numel()) != table.shape:
                raise UserError(f"table {name!r}: recorded sizes changed between draws: {a.numel()} x {b.numel()}, "
                                f"expected {table.shape[0]} x {table.shape[1]}")
            if table.block == 1:
                accumulator(name, (chain, label)).update(a, b)
                continue
            key = (name, chain, label)
            rows, cols = pending.setdefault(key, ([], []))
            rows.append(a)
            cols.append(b)
            if len(rows) >= table.block:
                flush(key)

    diagnostics = sample_sgld(model, posterior, loss_fn, sampler, recorders, record, callbacks=callbacks,
                              accuracy_fn=accuracy_fn)
    for key in list(pending):
        flush(key)
    estimates = {}
    for name in tables:
        estimates[name] = estimate_from_moments(accumulators.pop(name), chains, sampler.pearson,
                                                with_phases=phase_fn is not None, per_chain_out=storage.pop(name, None))
    return estimates, diagnostics


def pick_stderr(estimate: BIFEstimate, method: str) -> Float[Tensor, "n_a n_b"]:
    """The standard error ``method`` names: ``"jackknife"`` (leave one chain out, of the pooled
    estimate) or ``"per_chain"`` (std of the chains' own estimates / sqrt(chains))."""
    if method not in STDERR_METHODS:
        raise UserError(f"stderr_method must be one of {STDERR_METHODS}, got {method!r}")
    if method == "per_chain":
        assert estimate.per_chain_stderr is not None  # the estimator always fills it
        return estimate.per_chain_stderr
    return estimate.stderr


__all__ = ["STDERR_METHODS", "DrawHook", "StreamedTable", "pick_stderr", "stream_tables"]
