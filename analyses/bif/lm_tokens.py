"""The token sets, groupings and reductions of token-level BIF (:mod:`.lm`).

A :class:`TokenSet` holds recorded sequences and each predicted token's class; a *grouping*
(:data:`GROUPINGS`) maps tokens to groups; a reduction ``"<train grouping>:<query grouping>"`` is
the mean of the token-level matrix over each block (:func:`reduce_matrix`, :class:`ReducedBIF`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_toolkit.analyses.bif.engine import STDERR_METHODS  # re-exported: the LM configs validate with it
from interp_toolkit.errors import UserError
from interp_toolkit.io import tensor_digest
from interp_toolkit.runs.forward import sequence_forward

DEFAULT_REDUCTIONS = ("class:class", "class:all", "sequence:sequence")
GROUPINGS = ("token", "sequence", "class", "all")
#: ``-Corr`` of a reduction: mean of token-level correlations (devinterp's), or correlation
#: of group-mean losses.
PEARSON_CONVENTIONS = ("token_mean", "group_means")


#: Standard error of the pooled estimate: leave-one-chain-out jackknife, or the spread of the
#: chains' own estimates / sqrt(chains) (which misses the between-chain part of the pooled
#: covariance; see docs/lm_bif.md, "Cross-check with devinterp").


def next_token_losses(model: nn.Module, tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, "batch seq_minus_1"]:
    """Per-token next-token cross-entropy ``[batch, seq - 1]`` (position ``t`` predicts ``t + 1``).

    A toolkit model (``build_model`` / ``load_checkpoint``) runs the lean forward over its
    own parameters (:func:`interp_toolkit.runs.forward.sequence_forward`: the bridge's
    logits up to float rounding, no hooks) on all but the last token, whose logits no loss
    uses (the lean forward is causal, so the others do not depend on it); any other model
    runs ``model(tokens)``.
    """
    batch, seq = tokens.shape
    forward = None
    if isinstance(model, nn.Module) and getattr(model, "interp_config", None) is not None:
        forward = sequence_forward(model)
    if forward is not None and forward.fast:
        logits = forward(tokens[:, :-1])
    else:
        logits = model(tokens)[:, :-1]
    # classes on the last dim: log-softmax over contiguous rows (~5x faster here than over dim 1)
    return F.cross_entropy(logits.reshape(batch * (seq - 1), -1).float(), tokens[:, 1:].reshape(-1),
                           reduction="none").view(batch, seq - 1)


@dataclass
class TokenSet:
    """Sequences whose per-token losses are recorded, with a class label per loss.

    Attributes:
        tokens: ``[n_sequences, seq_len]`` token ids.
        classes: Class id of every *loss*, ``[n_sequences, seq_len - 1]`` (the class of the
            predicted token; see ``induction_corpus.target_classes``); ``None``: all class 0.
        class_names: Name of each class id (default ``class0``, ``class1``, ...).
    """

    tokens: Int[Tensor, "n seq"]
    classes: Int[Tensor, "n seq_minus_1"] | None = None
    class_names: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if (not isinstance(self.tokens, Tensor) or self.tokens.ndim != 2
                or self.tokens.dtype not in (torch.long, torch.int32)):
            raise UserError("TokenSet.tokens must be an integer tensor [n, seq_len], got "
                            f"{getattr(self.tokens, 'shape', self.tokens)!r}")
        if self.tokens.shape[1] < 2 or self.tokens.shape[0] < 1:
            raise UserError(f"TokenSet.tokens needs >= 1 sequence of >= 2 tokens, got {tuple(self.tokens.shape)}")
        expected = (self.tokens.shape[0], self.tokens.shape[1] - 1)
        if self.classes is None:
            self.classes = torch.zeros(expected, dtype=torch.long)
        if tuple(self.classes.shape) != expected:
            raise UserError(
                f"TokenSet.classes must have shape [n, seq_len - 1] = {list(expected)} (one label per "
                f"next-token loss), got {list(self.classes.shape)}"
            )
        if (self.classes < 0).any():
            raise UserError("TokenSet.classes must be >= 0")
        n_classes = int(self.classes.max()) + 1
        if self.class_names is None:
            self.class_names = [f"class{i}" for i in range(n_classes)]
        self.class_names = list(self.class_names)
        if len(self.class_names) < n_classes:
            raise UserError(f"TokenSet.class_names has {len(self.class_names)} names but class ids go up to "
                            f"{n_classes - 1}")

    @property
    def n_tokens(self) -> int:
        """Recorded losses (``n x (seq_len - 1)``)."""
        assert self.classes is not None  # __post_init__ fills the default
        return int(self.classes.numel())

    def fingerprint(self) -> str:
        assert self.classes is not None  # __post_init__ fills the default
        return tensor_digest([self.tokens, self.classes], extra=self.class_names)


def group_ids(tokens: TokenSet, grouping: str) -> tuple[Int[Tensor, " n_tokens"], list[str]]:
    """Group id of every recorded loss (flattened row-major) and the group labels.

    ``"class"`` keeps only classes present in ``tokens`` (labels = class names).
    """
    # TokenSet.__post_init__ fills both defaults
    assert tokens.classes is not None and tokens.class_names is not None
    n, m = tokens.classes.shape
    if grouping == "token":
        return torch.arange(n * m), [f"s{s}t{t}" for s in range(n) for t in range(m)]
    if grouping == "sequence":
        return torch.arange(n).repeat_interleave(m), [f"seq{s}" for s in range(n)]
    if grouping == "all":
        return torch.zeros(n * m, dtype=torch.long), ["all"]
    if grouping == "class":
        flat = tokens.classes.reshape(-1)
        present = torch.unique(flat)
        remap = torch.full((int(flat.max()) + 1,), -1, dtype=torch.long)
        remap[present] = torch.arange(len(present))
        return remap[flat], [tokens.class_names[int(c)] for c in present]
    raise UserError(f"unknown grouping {grouping!r}; expected one of {GROUPINGS}")


def _group_mean(values: Tensor, ids: Tensor, counts: Tensor) -> Tensor:
    out = torch.zeros(counts.shape[0], dtype=torch.float64)
    return out.index_add_(0, ids, values.to(torch.float64)) / counts


def reduce_matrix(
    matrix: Float[Tensor, "n_a n_b"], train_ids: Int[Tensor, " n_a"], query_ids: Int[Tensor, " n_b"]
) -> Float[Tensor, "k_a k_b"]:
    """Average a full token-level matrix over (train group, query group) blocks."""
    k_a, k_b = int(train_ids.max()) + 1, int(query_ids.max()) + 1
    m = matrix.double()
    rows = torch.zeros(k_a, m.shape[1], dtype=torch.float64).index_add_(0, train_ids, m)
    rows /= torch.bincount(train_ids, minlength=k_a).double()[:, None]
    out = torch.zeros(k_a, k_b, dtype=torch.float64).index_add_(1, query_ids, rows)
    return out / torch.bincount(query_ids, minlength=k_b).double()[None, :]


@dataclass
class ReducedBIF:
    """One reduction of the token-level BIF.

    Attributes:
        bif: ``-Cov`` (or ``-Corr``) averaged over (train group, query group) blocks.
        stderr: Std across chains / sqrt(chains) (NaN for one chain).
        per_chain: Each chain's estimate.
        row_labels, col_labels: Train / query group labels.
    """

    bif: Float[Tensor, "k_a k_b"]
    stderr: Float[Tensor, "k_a k_b"]
    per_chain: Float[Tensor, "chains k_a k_b"]
    row_labels: list[str]
    col_labels: list[str]


__all__ = ["DEFAULT_REDUCTIONS", "GROUPINGS", "PEARSON_CONVENTIONS", "STDERR_METHODS", "ReducedBIF", "TokenSet",
           "group_ids", "next_token_losses", "reduce_matrix"]
