"""Token-level Bayesian influence functions for language models, across checkpoints.

At every SGLD draw ``w`` of the localized posterior (the sampler of
:mod:`interp_toolkit.analyses.bif`, unchanged) we record the next-token loss of every
position of a set of *training* sequences, ``a[s, t](w)``, and of *query* sequences,
``b[u, v](w)``. The token-level BIF is

    BIF[(s, t), (u, v)] = -Cov_w(a[s, t], b[u, v])

(population covariance over draws; negative = up-weighting train token ``(s, t)`` lowers
the loss of query token ``(u, v)``). ``pearson=True`` gives ``-Corr`` instead.

Pearson conventions for a reduction (:data:`PEARSON_CONVENTIONS`, ``LMBIFConfig.pearson_convention``):

* ``"token_mean"`` (devinterp's ``average_tokenwise_bif``, the paper's): the *mean of the
  token-level correlations* over the block. Computed exactly from the kept per-token
  draws: the block mean of ``Corr(a_i, b_j)`` is the covariance of the group means of
  the *standardized* losses ``(a_i - mean a_i) / std a_i``.
* ``"group_means"`` (the toolkit's first convention): the *correlation of the group-mean
  losses*, streamed like the covariance. It weights tokens by their loss variance, so a
  few high-variance tokens dominate a class.

Both equal ``-Corr`` for ``"token:token"``; covariances (``pearson=False``) do not depend
on the convention.

Reductions. A *grouping* maps each token to a group: ``"token"`` (every position its own
group), ``"sequence"``, ``"class"`` (the token-class label of the predicted token) or
``"all"``. A reduction ``"<train grouping>:<query grouping>"`` (e.g. ``"class:class"``,
``"class:all"``, ``"sequence:sequence"``, ``"token:token"`` = the full matrix) is the
average of the full matrix over each (train group, query group) block. By linearity of the
covariance this equals ``-Cov(mean of a over the train group, mean of b over the query
group)``, so each reduction is accumulated *directly from group means at every draw* and
the full matrix is never formed unless asked for.

Memory (streaming; independent of the number of draws), with ``N_a``/``N_b`` the recorded
train/query tokens and ``k_a x k_b`` a reduction's shape: ``O(chains x sum_r k_a k_b)``
float64 for the co-moments (``"token:token"``: ``chains x N_a x N_b x 8`` bytes, guarded by
``LMBIFConfig.max_matrix_entries``), plus ``O(N_a + N_b)`` per draw for the recorded
losses and one forward pass of ``eval_batch_size`` sequences. ``keep_draws=True``, and
``pearson`` with the ``"token_mean"`` convention, store ``chains x draws x (N_a + N_b)``
floats (the latter drops them from the result unless ``keep_draws``).

Two levels, as in devinterp: :func:`lm_bif` samples and estimates (a thin front end of the one
engine, :func:`~.engine.stream_tables`: it supplies the per-token loss recorders and one table
per streamed reduction, the group means of the train and query tokens);
:func:`~.lm_estimate.compute_lm_bif` estimates every reduction from stored per-token draws (ours
or another library's). The token sets, groupings and reductions are in :mod:`.lm_tokens`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_toolkit.analyses.bif.config import SamplerConfig
from interp_toolkit.analyses.bif.data import model_fingerprint
from interp_toolkit.analyses.bif.diagnostics import (
    ADVICE,
    ConvergenceDiagnostics,
    convergence_diagnostics,
    tracked_indices,
)
from interp_toolkit.analyses.bif.engine import StreamedTable, pick_stderr, stream_tables
from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif
from interp_toolkit.analyses.bif.lm_tokens import (
    DEFAULT_REDUCTIONS,
    GROUPINGS,
    PEARSON_CONVENTIONS,
    STDERR_METHODS,
    ReducedBIF,
    TokenSet,
    _group_mean,
    group_ids,
    next_token_losses,
)
from interp_toolkit.analyses.bif.locality import LOCALITY_ADVICE, Locality, locality_of, sampling_verdict
from interp_toolkit.analyses.bif.results import (
    diagnostics_from,
    diagnostics_metadata,
    diagnostics_tensors,
)
from interp_toolkit.analyses.bif.sampler import SamplerDiagnostics
from interp_toolkit.config import Config
from interp_toolkit.errors import UserError
from interp_toolkit.io import config_hash, is_artifact, load_artifact, save_artifact

LM_RESULT_FILE = "lm_bif.safetensors"

__all__ = ["LMBIFConfig", "LMBIFResult", "lm_bif"]



@dataclass
class LMBIFConfig(Config):
    """Validated settings of a token-level BIF run.

    Attributes:
        sampler: SGLD settings (``keep_draws`` keeps per-token draws; ``pearson`` -> -Corr).
        reductions: ``"<train grouping>:<query grouping>"`` with groupings in
            :data:`GROUPINGS`; ``"token:token"`` is the full matrix.
        max_matrix_entries: Refuse reductions with more than this many entries (memory
            guard: each entry costs ``8 x (chains + 2)`` bytes).
        pearson_convention: With ``sampler.pearson``: ``"token_mean"`` (mean of token-level
            correlations over each block, devinterp's and the paper's) or ``"group_means"``
            (correlation of the group-mean losses). See the module docstring.
        stderr_method: ``"jackknife"`` (leave-one-chain-out, default) or ``"per_chain"``
            (std of the chains' own estimates / sqrt(chains)); see :data:`STDERR_METHODS`.
    """

    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reductions: tuple[str, ...] = DEFAULT_REDUCTIONS
    max_matrix_entries: int = 4_000_000
    pearson_convention: str = "token_mean"
    stderr_method: str = "jackknife"

    def __post_init__(self) -> None:
        if isinstance(self.sampler, Mapping):
            self.sampler = SamplerConfig.from_dict(self.sampler)
        if not isinstance(self.sampler, SamplerConfig):
            raise UserError(f"LMBIFConfig.sampler must be a SamplerConfig, got {type(self.sampler).__name__}")
        if isinstance(self.reductions, str):
            self.reductions = (self.reductions,)
        self.reductions = tuple(self.reductions)
        if not self.reductions or len(set(self.reductions)) != len(self.reductions):
            raise UserError(f"LMBIFConfig.reductions must be non-empty and distinct, got {self.reductions!r}")
        for reduction in self.reductions:
            parts = reduction.split(":") if isinstance(reduction, str) else []
            if len(parts) != 2 or parts[0] not in GROUPINGS or parts[1] not in GROUPINGS:
                raise UserError(
                    f"LMBIFConfig.reductions entry {reduction!r} must be 'train:query' with both in {GROUPINGS}"
                )
        entries = self.max_matrix_entries
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
            raise UserError(f"LMBIFConfig.max_matrix_entries must be an integer >= 1, got {self.max_matrix_entries!r}")
        if self.pearson_convention not in PEARSON_CONVENTIONS:
            raise UserError(
                f"LMBIFConfig.pearson_convention must be one of {PEARSON_CONVENTIONS}, got {self.pearson_convention!r}"
            )

        if self.stderr_method not in STDERR_METHODS:
            raise UserError(f"LMBIFConfig.stderr_method must be one of {STDERR_METHODS}, got {self.stderr_method!r}")


@dataclass
class LMBIFResult:
    """Token-level BIF at one checkpoint.

    Attributes:
        reductions: ``"train:query" -> ReducedBIF``.
        pearson: Whether the entries are ``-Corr`` (which convention:
            ``config["pearson_convention"]``; see the module docstring).
        train_mean_loss, query_mean_loss: Posterior mean loss per recorded token.
        diagnostics: SGLD health (``None`` when loaded from a cache without it).
        train_draws, query_draws: Per-token draws ``[chains, draws, n_tokens]`` if kept.
        config: The :class:`LMBIFConfig` as a dict.
        cache_key: Config hash of the cached result.
        convergence: Split R-hat, bulk/tail ESS and between-chain share of the
            ``class:class`` entries (``-Cov`` of the classes' mean losses), from the classes'
            mean losses at every draw (``chains x draws x classes`` numbers, never the
            per-token draws), plus the mean losses and the distance from ``w*``.
        train_class_means, query_class_means: Every class's mean loss at every draw,
            ``[chains, draws, classes]`` (the ``class:class`` reduction is ``-Cov`` of these;
            :mod:`.claims` computes class-to-class influences, their jackknife errors and
            R-hat / ESS from them). ``None`` in results of an older format.
        train_class_labels, query_class_labels: Class names of their last axis.
    """

    reductions: dict[str, ReducedBIF]
    pearson: bool
    train_mean_loss: Float[Tensor, " n_a"]
    query_mean_loss: Float[Tensor, " n_b"]
    diagnostics: SamplerDiagnostics | None = None
    train_draws: Float[Tensor, "chains draws n_a"] | None = None
    query_draws: Float[Tensor, "chains draws n_b"] | None = None
    config: dict[str, Any] | None = None
    cache_key: str | None = None
    convergence: ConvergenceDiagnostics | None = None
    train_class_means: Float[Tensor, "chains draws k_a"] | None = None
    query_class_means: Float[Tensor, "chains draws k_b"] | None = None
    train_class_labels: list[str] | None = None
    query_class_labels: list[str] | None = None
    locality: Locality | None = None

    @property
    def verdict(self) -> str:
        """``converged and local``, ``converged, not local`` or ``not converged``."""
        return sampling_verdict(self.convergence is not None and self.convergence.converged, self.locality)

    def __getitem__(self, reduction: str) -> ReducedBIF:
        if reduction not in self.reductions:
            raise KeyError(f"no reduction {reduction!r}; have {sorted(self.reductions)}")
        return self.reductions[reduction]

    def save(self, directory: str | Path) -> Path:
        """Write the result as one artifact, ``directory/lm_bif.safetensors`` (tensors, metadata,
        per-tensor digests; :func:`interp_toolkit.io.save_artifact`). Returns ``directory``."""
        directory = Path(directory)
        tensors = {"train_mean_loss": self.train_mean_loss, "query_mean_loss": self.query_mean_loss}
        labels = {}
        for name, red in self.reductions.items():
            for part in ("bif", "stderr", "per_chain"):
                tensors[f"{name}.{part}"] = getattr(red, part)
            labels[name] = {"rows": red.row_labels, "cols": red.col_labels}
        if self.train_draws is not None:
            tensors["train_draws"] = self.train_draws
        if self.query_draws is not None:
            tensors["query_draws"] = self.query_draws
        if self.diagnostics is not None:
            tensors.update(diagnostics_tensors(self.diagnostics))
        if self.convergence is not None:
            tensors.update(self.convergence.tensors())
        class_means = None
        if self.train_class_means is not None and self.query_class_means is not None:
            tensors["class_means.train"] = self.train_class_means
            tensors["class_means.query"] = self.query_class_means
            class_means = {"train": self.train_class_labels, "query": self.query_class_labels}
        meta = {
            "pearson": self.pearson, "labels": labels, "order": list(self.reductions), "config": self.config,
            "cache_key": self.cache_key,
            "diagnostics": None if self.diagnostics is None else diagnostics_metadata(self.diagnostics),
            "convergence": None if self.convergence is None else self.convergence.metadata(),
            "class_means": class_means,
            "locality": None if self.locality is None else self.locality.to_dict(),
        }
        save_artifact(directory / LM_RESULT_FILE, tensors, meta, kind="lm_bif_result")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "LMBIFResult":
        """Read a result written by :meth:`save`: field by field the object that was saved."""
        directory = Path(directory)
        t, meta = load_artifact(directory / LM_RESULT_FILE, kind="lm_bif_result")
        reductions = {
            name: ReducedBIF(t[f"{name}.bif"], t[f"{name}.stderr"], t[f"{name}.per_chain"], lab["rows"], lab["cols"])
            for name, lab in ((n, meta["labels"][n]) for n in meta["order"])
        }
        diagnostics = diagnostics_from(t, meta["diagnostics"]) if meta["diagnostics"] is not None else None
        convergence = (ConvergenceDiagnostics.from_artifact(t, meta["convergence"])
                       if meta.get("convergence") is not None else None)
        class_means = meta.get("class_means")
        return cls(reductions, meta["pearson"], t["train_mean_loss"], t["query_mean_loss"], diagnostics,
                   t.get("train_draws"), t.get("query_draws"), meta["config"], meta["cache_key"], convergence,
                   t.get("class_means.train"), t.get("class_means.query"),
                   None if class_means is None else list(class_means["train"]),
                   None if class_means is None else list(class_means["query"]),
                   None if meta.get("locality") is None else Locality.from_dict(meta["locality"]))

    @staticmethod
    def is_stored(directory: str | Path) -> bool:
        """Whether ``directory`` holds a saved result (a cache hit; a file of an earlier format,
        one without convergence diagnostics or without the classes' mean losses, is not)."""
        path = Path(directory) / LM_RESULT_FILE
        if not is_artifact(path, kind="lm_bif_result"):
            return False
        meta = load_artifact(path, kind="lm_bif_result")[1]
        return meta.get("convergence") is not None and meta.get("class_means") is not None


def lm_bif(
    model: nn.Module,
    posterior_tokens: Int[Tensor, "n_post seq"],
    train: TokenSet,
    query: TokenSet | None,
    config: LMBIFConfig,
    *,
    loss_fn: Callable[[nn.Module, Tensor], Tensor] = next_token_losses,
    cache_dir: str | Path | None = None,
    cache_identity: Mapping[str, Any] | None = None,
    reference_loss: float | None = None,
    reference: str = "unigram cross-entropy",
    advice: str = ADVICE,
) -> LMBIFResult:
    """Token-level BIF of training tokens on query tokens at the model's current weights.

    Args:
        model: A language model ``tokens -> logits`` (e.g. a ``TransformerBridge``); its
            weights are the localization centre and are restored afterwards.
        posterior_tokens: Training sequences defining the posterior (SGLD minibatches).
        train: Recorded training sequences (rows of every reduction).
        query: Recorded query sequences (columns); ``None``: the same as ``train`` (recorded
            once per draw).
        config: Sampler settings and reductions.
        loss_fn: ``loss_fn(model, tokens) -> [batch, seq - 1]`` per-token losses; its mean is
            the SGLD loss.
        cache_dir: If given, the result is stored under ``cache_dir/lm_bif_<hash>/`` keyed
            by the config, data, model weights (or ``cache_identity``) and loss name; a
            rerun with the same key loads it.
        cache_identity: JSON-able identity of the model used instead of hashing its weights
            (e.g. :meth:`CheckpointRef.identity`).
        reference_loss: The posterior tokens' loss once the model's solution is gone, for the
            locality gate (:mod:`.locality`): e.g. :func:`~.locality.unigram_loss` of
            ``posterior_tokens`` (a model that only knows token frequencies). None: unmeasured.
        reference: What ``reference_loss`` is.
        advice: What a convergence warning recommends.

    Returns:
        The :class:`LMBIFResult` (``result.locality``, ``result.verdict``).
    """
    if not isinstance(config, LMBIFConfig):
        raise UserError(f"config must be an LMBIFConfig, got {type(config).__name__}")
    if not isinstance(train, TokenSet) or (query is not None and not isinstance(query, TokenSet)):
        raise UserError("train and query must be TokenSet instances (query may be None)")
    if not isinstance(posterior_tokens, Tensor) or posterior_tokens.ndim != 2:
        raise UserError("posterior_tokens must be a [n, seq_len] tensor, got "
                        f"{getattr(posterior_tokens, 'shape', posterior_tokens)!r}")
    same = query is None
    query = train if query is None else query
    sampler = config.sampler
    groupings = {}
    shapes = {}
    for reduction in config.reductions:
        g_a, g_b = reduction.split(":")
        for side, grouping, tokens in (("a", g_a, train), ("b", g_b, query)):
            if (side, grouping) not in groupings:
                ids, labels = group_ids(tokens, grouping)
                groupings[(side, grouping)] = (ids, labels, torch.bincount(ids).double())
        k_a, k_b = len(groupings[("a", g_a)][1]), len(groupings[("b", g_b)][1])
        if k_a * k_b > config.max_matrix_entries:
            raise UserError(
                f"reduction {reduction!r} has {k_a} x {k_b} = {k_a * k_b} entries, above "
                f"LMBIFConfig.max_matrix_entries = {config.max_matrix_entries}: use fewer recorded tokens "
                "or a coarser grouping (class, sequence, all)"
            )
        shapes[reduction] = (k_a, k_b)

    key = None
    if cache_dir is not None:

        identity = {
            "config": {**config.to_dict(), "sampler": {k: v for k, v in sampler.to_dict().items() if k != "progress"}},
            "model": dict(cache_identity) if cache_identity is not None else model_fingerprint(model),
            "posterior": TokenSet(posterior_tokens).fingerprint(),
            "train": train.fingerprint(),
            "query": None if same else query.fingerprint(),
            "loss_fn": getattr(loss_fn, "__qualname__", repr(loss_fn)),
        }
        if reference_loss is not None:  # (absent: the keys of earlier results)
            identity["locality"] = {"reference_loss": reference_loss, "reference": reference}
        key = config_hash(identity)
        out = Path(cache_dir) / f"lm_bif_{key}"
        if LMBIFResult.is_stored(out):
            return LMBIFResult.load(out)

    def recorder(tokens: Tensor) -> Callable[[nn.Module], Tensor]:
        def record(m: nn.Module) -> Tensor:
            parts = [loss_fn(m, tokens[i : i + sampler.eval_batch_size]).reshape(-1)
                     for i in range(0, tokens.shape[0], sampler.eval_batch_size)]
            return torch.cat(parts)

        return record

    recorders = {"train": recorder(train.tokens)}
    if not same:
        recorders["query"] = recorder(query.tokens)
    # devinterp's Pearson convention standardizes each token by its posterior std, known
    # only at the end: keep the per-token draws and estimate every reduction from them.
    # Otherwise a reduction is streamed (co-moments updated at every draw) unless its
    # co-moment matrix is larger than the draws themselves (e.g. "token:token" with fewer
    # draws than tokens): then it is computed once from the kept draws, which is faster
    # and needs chains x draws x (N_a + N_b) floats instead of chains x N_a x N_b.
    all_from_draws = sampler.pearson and config.pearson_convention == "token_mean"
    draws_size = sampler.draws * (train.n_tokens + (0 if same else query.n_tokens))
    from_draws = {r for r in config.reductions
                  if all_from_draws or (not sampler.pearson and shapes[r][0] * shapes[r][1] > draws_size)}
    streamed = [r for r in config.reductions if r not in from_draws]
    keep = sampler.keep_draws or bool(from_draws)
    # the losses arrive as float32: float32 storage is exact (float64 kept for keep_draws' API)
    kept_dtype = torch.float64 if sampler.keep_draws else torch.float32
    kept_a = torch.zeros(sampler.chains, sampler.draws, train.n_tokens, dtype=kept_dtype) if keep else None
    kept_b = (
        (kept_a if same else torch.zeros(sampler.chains, sampler.draws, query.n_tokens, dtype=kept_dtype))
        if keep
        else None
    )
    sum_a = torch.zeros(train.n_tokens, dtype=torch.float64)
    sum_b = torch.zeros(query.n_tokens, dtype=torch.float64)
    # one engine table per streamed reduction: -Cov of the train group means and the query
    # group means (by linearity, the block average of the token matrix)
    streamed_groupings = {(side, g) for r in streamed for side, g in zip("ab", r.split(":"))}
    streamed_tables = {r: StreamedTable(f"a:{r.split(':')[0]}", f"b:{r.split(':')[1]}", shapes[r]) for r in streamed}
    # the classes' mean losses at every draw, for the convergence diagnostics
    diag_ids_a, class_labels_a = group_ids(train, "class")
    diag_ids_b, class_labels_b = group_ids(query, "class")
    diag_counts_a, diag_counts_b = torch.bincount(diag_ids_a).double(), torch.bincount(diag_ids_b).double()
    diag_rows = tracked_indices(int(diag_counts_a.numel()))
    diag_cols = tracked_indices(int(diag_counts_b.numel()))
    # every class's mean loss at every draw (the diagnostics track up to 16 of them)
    class_a = torch.zeros(sampler.chains, sampler.draws, len(class_labels_a), dtype=torch.float64)
    class_b = torch.zeros(sampler.chains, sampler.draws, len(class_labels_b), dtype=torch.float64)
    mean_a_trace = torch.zeros(sampler.chains, sampler.draws, dtype=torch.float64)
    mean_b_trace = torch.zeros(sampler.chains, sampler.draws, dtype=torch.float64)

    def on_draw(chain: int, draw: int, values: dict[str, Tensor], label: int) -> None:
        a = values["train"]
        b = a if same else values["query"]
        if a.numel() != train.n_tokens or b.numel() != query.n_tokens:
            raise UserError(
                f"loss_fn returned {a.numel()} / {b.numel()} losses, expected {train.n_tokens} / {query.n_tokens} "
                "(one per position after the first)"
            )
        sum_a.add_(a)
        sum_b.add_(b)
        class_a[chain, draw] = _group_mean(a, diag_ids_a, diag_counts_a)
        class_b[chain, draw] = _group_mean(b, diag_ids_b, diag_counts_b)
        mean_a_trace[chain, draw] = a.mean()
        mean_b_trace[chain, draw] = b.mean()
        if kept_a is not None and kept_b is not None:  # both or neither (keep)
            kept_a[chain, draw] = a
            if not same:
                kept_b[chain, draw] = b
        for side, grouping in streamed_groupings:  # each grouping's means once per draw, for every table
            ids, _, counts = groupings[(side, grouping)]
            values_side = a if side == "a" else b
            values[f"{side}:{grouping}"] = values_side if grouping == "token" else _group_mean(values_side, ids, counts)

    estimates, diagnostics = stream_tables(model, posterior_tokens, loss_fn, sampler, recorders, streamed_tables,
                                           on_draw=on_draw)
    tables = {}
    if from_draws:
        assert kept_a is not None and kept_b is not None  # from_draws implies keep
        tables.update(compute_lm_bif(kept_a, None if same else kept_b, train, None if same else query,
                                     [r for r in config.reductions if r in from_draws], pearson=sampler.pearson,
                                     pearson_convention=config.pearson_convention, stderr_method=config.stderr_method))
    for reduction, estimate in estimates.items():
        g_a, g_b = reduction.split(":")
        tables[reduction] = ReducedBIF(estimate.bif, pick_stderr(estimate, config.stderr_method), estimate.per_chain,
                                       groupings[("a", g_a)][1], groupings[("b", g_b)][1])
    tables = {r: tables[r] for r in config.reductions}
    scalars = {"mean train loss": mean_a_trace, "mean query loss": mean_b_trace}
    if diagnostics.distance_trace is not None:
        at_draws = (torch.arange(sampler.draws) * sampler.steps_between_draws + sampler.burn_in
                    + sampler.steps_between_draws - 1)
        scalars["distance from w*"] = diagnostics.distance_trace[:, at_draws]
    convergence = convergence_diagnostics(class_a[..., diag_rows], class_b[..., diag_cols], diag_rows, diag_cols,
                                          scalars=scalars, advice=advice)
    for note in convergence.warnings:
        warnings.warn(f"LM BIF not converged: {note}", stacklevel=2)
    locality = locality_of(diagnostics, sampler, reference_loss, reference)
    if not locality.local and reference_loss is not None:
        warnings.warn(f"LM BIF not local: {'; '.join(locality.failed)}; {LOCALITY_ADVICE}", stacklevel=2)
    n_draws = sampler.chains * sampler.draws
    if not sampler.keep_draws:
        kept_a = kept_b = None
    result = LMBIFResult(
        reductions=tables, pearson=sampler.pearson, train_mean_loss=sum_a / n_draws, query_mean_loss=sum_b / n_draws,
        diagnostics=diagnostics, train_draws=kept_a, query_draws=kept_b, config=config.to_dict(), cache_key=key,
        convergence=convergence, train_class_means=class_a, query_class_means=class_b,
        train_class_labels=class_labels_a, query_class_labels=class_labels_b, locality=locality,
    )
    if cache_dir is not None:
        result.save(Path(cache_dir) / f"lm_bif_{key}")
    return result


