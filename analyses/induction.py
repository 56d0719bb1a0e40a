"""Induction-head score: prefix-matching attention on repeated random sequences.

On ``[BOS] + r + r`` (``r`` of length ``L``), an induction head attending from the second
copy of ``r_j`` (position ``dest = 1 + L + j``) looks at the token *after* the first copy
of ``r_j`` (position ``2 + j = dest - L + 1``). The score of a head is its mean attention
weight on that position over the second half; the model's score is the max over heads.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel

__all__ = ["induction_scores", "induction_score"]


def induction_scores(
    model: HookedModel, tokens: Int[Tensor, "batch seq"], half_len: int, bos: bool = True
) -> Float[Tensor, "n_layers n_heads"]:
    """Mean prefix-matching attention of every head on repeated sequences.

    Args:
        model: A TransformerLens ``TransformerBridge`` (any source) exposing
            ``blocks.{layer}.attn.hook_pattern``.
        tokens: ``[BOS] + r + r`` sequences (see
            :func:`interp_toolkit.tasks.induction_corpus.repeated_random_tokens`).
        half_len: ``L``, the length of ``r``.
        bos: Whether the sequences start with one BOS token.

    Returns:
        Score per (layer, head), in ``[0, 1]``.
    """
    offset = 1 if bos else 0
    if tokens.ndim != 2 or tokens.shape[1] != offset + 2 * half_len:
        raise UserError(
            f"tokens must be [batch, {offset + 2 * half_len}] for half_len {half_len} (bos={bos}), "
            f"got {tuple(tokens.shape)}"
        )
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    dest = torch.arange(offset + half_len, offset + 2 * half_len)  # the second copy of r
    src = dest - half_len + 1
    scores = []
    for name in names:
        pattern = cache[name]  # [batch, heads, q, k]
        scores.append(pattern[:, :, dest, src].float().mean(dim=(0, 2)))
    return torch.stack(scores).cpu()


def induction_score(model: HookedModel, tokens: Int[Tensor, "batch seq"], half_len: int, bos: bool = True) -> float:
    """Max over heads of :func:`induction_scores`."""
    return float(induction_scores(model, tokens, half_len, bos).max())
