"""QK magnitude and OV parity fingerprints of every attention head.

* **QK magnitude fingerprint** (data-driven, any layer): Spearman rho between the
  pre-softmax attention score from the readout position to each value position and the
  token value at that position, pooled over (example, position) pairs of a split. Also
  ``first_share``: the mean share of readout attention on position 0 (the first-element
  shortcut).
* **OV parity fingerprint**: the head's OV output written into the class-logit directions,
  centred over classes, against ``v mod m``; for m > 2 the mean over classes of rho against
  the one-vs-rest indicator ``v mod m == c`` (for m = 2 that equals rho against ``v mod 2``).
  Three versions: ``ov`` from the weights, ``W_E[v] W_V W_O W_U`` for every value token v
  (the direct path; LayerNorm and biases are ignored); ``ov_data`` through the head's actual
  output at the readout position, against the value of the position it attends to most; and
  ``ov_label`` through the same output, against the example's label.

Pre-softmax scores are computed from ``hook_q``/``hook_k`` as q.k / sqrt(d_head) with the
causal mask (on TransformerLens 4.3 ``boot_native`` models ``hook_attn_scores`` is
post-softmax). If softmax of that does not reproduce ``hook_pattern`` (e.g. rotary models,
whose ``hook_q`` is pre-rotation), the non-normalized ``hook_attn_scores`` is used when it is
pre-softmax, else ``log(hook_pattern)`` (pre-softmax up to a per-query constant); the
``score_source`` column says which.

High level: :func:`fingerprints`. Low level: :func:`pre_softmax_scores`,
:func:`compute_qk_fingerprint`, :func:`compute_ov_fingerprint`. Circuits as
``FactoredMatrix``: :func:`qk_circuit`, :func:`ov_circuit`, :func:`full_ov_circuit`,
:func:`full_qk_circuit`.

Table: one row per head with ``layer, head, component, qk_rho, qk_p, first_share,
ov_rho, ov_p, ov_data_rho, ov_data_p, ov_label_rho, ov_label_p, score_source, n``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from scipy import stats
from torch import Tensor
from transformer_lens import FactoredMatrix
from transformer_lens.utilities import get_act_name

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel

from ._common import (
    AnalysisResult,
    Table,
    callable_module,
    check_positions,
    check_positive_int,
    check_splits,
    first_n,
    model_device,
    model_shape,
)

VALUE_COLUMNS = ("qk_rho", "first_share", "ov_rho", "ov_data_rho", "ov_label_rho")


def pre_softmax_scores(
    q: Float[Tensor, "batch qpos head d_head"], k: Float[Tensor, "batch kpos head d_head"],
    scale: float | None = None,
) -> Float[Tensor, "batch head qpos kpos"]:
    """Causally masked pre-softmax attention scores q.k / scale (default scale sqrt(d_head))."""
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise UserError(f"q and k must be [batch, pos, head, d_head] with matching batch/head/d_head, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    scale = math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / scale
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf"))


def _spearman(x: Tensor, y: Tensor) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x_np, y_np = x.detach().double().cpu().numpy().ravel(), y.detach().double().cpu().numpy().ravel()
        if x_np.size < 3 or x_np.std() == 0 or y_np.std() == 0:
            return float("nan"), float("nan")
        res = stats.spearmanr(x_np, y_np)
    return float(res.statistic), float(res.pvalue)


def compute_qk_fingerprint(
    scores: Float[Tensor, "n kpos"], values: Int[Tensor, "n kpos"],
) -> tuple[float, float]:
    """Spearman (rho, p) between readout scores and the token values at those positions."""
    if scores.shape != values.shape:
        raise UserError(f"scores and values must have one shape, got {tuple(scores.shape)} and {tuple(values.shape)}")
    return _spearman(scores, values)


def compute_ov_fingerprint(
    contributions: Float[Tensor, "n classes"], values: Int[Tensor, " n"], modulus: int,
) -> tuple[float, float]:
    """OV parity fingerprint from per-value (or per-example) class-logit contributions.

    Args:
        contributions: Logit contribution to each class (columns = classes 0..m-1).
        values: The value token (or target) each row belongs to.
        modulus: m; the target of class c is the indicator ``values mod m == c``.

    Returns:
        (mean over classes of Spearman rho of the centred contribution vs the one-vs-rest
        indicator, the largest per-class p-value).
    """
    if contributions.ndim != 2 or contributions.shape[1] != modulus:
        raise UserError(f"contributions must be [n, {modulus}] (one column per class), got "
                         f"{tuple(contributions.shape)}")
    if values.shape != contributions.shape[:1]:
        raise UserError(f"values must be [{contributions.shape[0]}], got {tuple(values.shape)}")
    centred = contributions - contributions.mean(1, keepdim=True)
    rhos, ps = [], []
    for c in range(modulus):
        rho, p = _spearman(centred[:, c], (values % modulus == c).float())
        rhos.append(rho)
        ps.append(p)
    return float(sum(rhos) / modulus), float(max(ps))


def qk_circuit(model: HookedModel, layer: int, head: int) -> FactoredMatrix:
    """The head's QK circuit W_Q W_K^T [d_model, d_model] as a ``FactoredMatrix``."""
    return model.QK[layer, head]


def ov_circuit(model: HookedModel, layer: int, head: int) -> FactoredMatrix:
    """The head's OV circuit W_V W_O [d_model, d_model] as a ``FactoredMatrix``."""
    return model.OV[layer, head]


def full_ov_circuit(model: HookedModel, layer: int, head: int) -> FactoredMatrix:
    """Token -> output-logit OV circuit W_E W_V W_O W_U [d_vocab, d_vocab_out]."""
    return FactoredMatrix(model.W_E @ model.W_V[layer, head], model.W_O[layer, head] @ model.W_U)


def full_qk_circuit(model: HookedModel, layer: int, head: int) -> FactoredMatrix:
    """Token-token QK circuit W_E W_Q W_K^T W_E^T [d_vocab, d_vocab] (direct path)."""
    return FactoredMatrix(model.W_E @ model.W_Q[layer, head], (model.W_E @ model.W_K[layer, head]).T)


def _readout_scores(q: Tensor, k: Tensor, pattern: Tensor, raw_scores: Tensor | None,
                    readout: int) -> tuple[Tensor, str]:
    scores = pre_softmax_scores(q, k)
    if torch.allclose(scores.softmax(-1), pattern, atol=1e-4, rtol=1e-3):
        return scores[:, :, readout], "qk"
    if raw_scores is not None:
        row_sums = raw_scores[:, :, readout].masked_fill(torch.isinf(raw_scores[:, :, readout]), 0).sum(-1)
        if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-3):
            return raw_scores[:, :, readout], "attn_scores"
    return pattern[:, :, readout].clamp_min(1e-30).log(), "log_pattern"


def fingerprints(
    model: HookedModel,
    splits: Mapping[str, Any],
    split: str = "train",
    modulus: int | None = None,
    value_positions: Sequence[int] | None = None,
    readout_position: int = -1,
    value_tokens: Sequence[int] | None = None,
    classes: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    n: int | None = 1024,
) -> AnalysisResult:
    """QK and OV fingerprints of every head on one split.

    Args:
        model: A TransformerLens model.
        splits: Named splits with ``.tokens`` [n, pos] and ``.labels`` [n].
        split: The split whose activations are used.
        modulus: m (default: the number of classes).
        value_positions: Positions holding values (default: every position but the readout).
        readout_position: Position the model predicts at.
        value_tokens: Token ids of the values for the weight-based OV fingerprint (default:
            the distinct tokens at the value positions of the split). Token id = value.
        classes: Output indices of the classes 0..m-1 (default: ``range(m)``).
        layers: Layers to measure (default: all).
        n: Use at most this many examples (``None``: all).

    Returns:
        :class:`AnalysisResult` with the per-head table and tensors ``scores``
        [layer, n, head, kpos] (readout-row pre-softmax scores at value positions),
        ``ov_weights`` [layer, head, value, class].
    """
    check_splits(splits, [split], model)
    check_positive_int("n", n, allow_none=True)
    shape = model_shape(model)
    tokens, labels = first_n(splits[split], n)
    seq_len = tokens.shape[1]
    readout = check_positions([readout_position], seq_len)[0]
    if value_positions is None:
        vpos = [p for p in range(seq_len) if p != readout]
    else:
        vpos = check_positions(value_positions, seq_len)
    if any(p > readout for p in vpos) or not vpos:
        raise UserError(f"value_positions {vpos} must be non-empty and at or before the readout {readout}")
    if value_positions is None:
        # The default layout is values then one readout token (MPSP); without that token the
        # "readout row" is just another value's row and the fingerprints measure nothing.
        at_readout = tokens[:, readout].unique().tolist()
        if len(at_readout) != 1 or at_readout[0] in set(tokens[:, vpos].unique().tolist()):
            shown = at_readout[:5] + (["..."] if len(at_readout) > 5 else [])
            raise UserError(
                f"split {split!r} has no readout token at position {readout_position}: expected one token id, "
                f"distinct from the values, there in every example; found ids {shown}. Append the task's "
                f"readout token (MPSP: n_values) or pass value_positions and readout_position explicitly"
            )
    if classes is not None:
        classes = list(classes)
        if any(not 0 <= c < shape["d_vocab_out"] for c in classes):
            raise UserError(f"classes {classes} out of range for d_vocab_out {shape['d_vocab_out']}")
    m = modulus if modulus is not None else (len(classes) if classes is not None else shape["d_vocab_out"])
    check_positive_int("modulus", m)
    if m < 2:
        raise UserError(f"modulus must be >= 2, got {m}")
    if classes is None:
        if m > shape["d_vocab_out"]:
            raise UserError(f"modulus {m} exceeds the model's d_vocab_out {shape['d_vocab_out']}; pass classes")
        classes = list(range(m))
    if len(classes) != m:
        raise UserError(f"classes must list {m} output indices (one per class), got {classes}")
    layer_list = list(range(shape["n_layers"])) if layers is None else list(layers)
    for layer in layer_list:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < shape["n_layers"]:
            raise UserError(f"layer {layer!r} out of range for a {shape['n_layers']}-layer model")
    values_at = tokens[:, vpos]
    vt = sorted(set(values_at.unique().tolist())) if value_tokens is None else list(value_tokens)
    vt_tensor = torch.tensor(vt, dtype=torch.long)

    names: set[str] = set()
    for layer in layer_list:
        names.update(get_act_name(x, layer) for x in ("q", "k", "z", "pattern", "attn_scores"))
    was_training = model.training
    model.eval()
    device = model_device(model)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens.to(device), names_filter=lambda name: name in names)
            W_U = model.W_U[:, classes]
            rows, all_scores, all_ov = [], [], []
            for layer in layer_list:
                q, k = cache[get_act_name("q", layer)], cache[get_act_name("k", layer)]
                pattern = cache[get_act_name("pattern", layer)]
                raw = cache[get_act_name("attn_scores", layer)] if get_act_name("attn_scores", layer) in cache else None
                scores, source = _readout_scores(q, k, pattern, raw, readout)
                scores = scores[:, :, vpos].cpu()  # [n, head, kpos]
                readout_pattern = pattern[:, :, readout].cpu()  # [n, head, kpos_all]
                z = cache[get_act_name("z", layer)][:, readout]  # [n, head, d_head]
                all_scores.append(scores)
                ov_layer = []
                for head in range(shape["n_heads"]):
                    qk_rho, qk_p = compute_qk_fingerprint(scores[:, head], values_at)
                    first_share = float(readout_pattern[:, head, 0].mean())
                    W_O = model.W_O[layer, head]
                    ov_w = (model.W_E[vt_tensor.to(device)] @ model.W_V[layer, head] @ W_O @ W_U).cpu()
                    ov_layer.append(ov_w)
                    ov_rho, ov_p = compute_ov_fingerprint(ov_w, vt_tensor, m)
                    out = (z[:, head] @ W_O @ W_U).cpu()  # [n, classes]
                    attended = values_at.gather(1, readout_pattern[:, head, vpos].argmax(-1, keepdim=True)).squeeze(1)
                    data_rho, data_p = compute_ov_fingerprint(out, attended, m)
                    label_rho, label_p = compute_ov_fingerprint(out, labels.cpu(), m)
                    rows.append({
                        "layer": layer, "head": head, "component": f"L{layer}H{head}",
                        "qk_rho": qk_rho, "qk_p": qk_p, "first_share": first_share,
                        "ov_rho": ov_rho, "ov_p": ov_p, "ov_data_rho": data_rho, "ov_data_p": data_p,
                        "ov_label_rho": label_rho, "ov_label_p": label_p,
                        "score_source": source, "n": int(tokens.shape[0]),
                    })
                all_ov.append(torch.stack(ov_layer))
    finally:
        model.train(was_training)
    config = {"split": split, "modulus": m, "value_positions": vpos, "readout_position": readout,
              "value_tokens": vt, "classes": classes, "layers": layer_list, "n": n}
    _warn_undefined(rows)
    return AnalysisResult(Table(rows), {"scores": torch.stack(all_scores), "ov_weights": torch.stack(all_ov)},
                          config)


def _warn_undefined(rows: list[dict[str, Any]]) -> None:
    """A NaN correlation is a constant input (a head whose scores or outputs do not vary over
    the examples, or data with one value): said once, never left to a silent blank table."""
    blank = [f"{row['component']}.{column}" for row in rows for column in ("qk_rho", "ov_rho", "ov_data_rho")
             if isinstance(row.get(column), float) and math.isnan(row[column])]
    if blank:
        shown = ", ".join(blank[:8]) + (f" and {len(blank) - 8} more" if len(blank) > 8 else "")
        warnings.warn(f"fingerprints: {shown} are NaN: a Spearman correlation is undefined where one of its "
                      "inputs is constant over the examples (a head whose scores or outputs do not vary, or "
                      "data with a single value)", UserWarning, stacklevel=3)


__all__ = ["VALUE_COLUMNS", "pre_softmax_scores", "compute_qk_fingerprint", "compute_ov_fingerprint",
           "qk_circuit", "ov_circuit", "full_ov_circuit", "full_qk_circuit", "fingerprints"]

callable_module(__name__)  # ``from interp_toolkit.analyses import fingerprints`` is callable either way
