"""A lean, exact training forward for readout-classification models (MPSP-style).

The loss of an MPSP run is a cross-entropy at one readout position ``r``. Causality means
nothing after ``r`` matters, and in the last layer only the readout query matters: the
engine runs every position ``<= r`` through the layers below the last, and in the last
layer computes the keys and values of every position but the query, attention, MLP,
final norm and unembedding at ``r`` only. Two more exact shortcuts:

* the input of layer 0 at a position is ``W_E[token] + W_pos[position]``, a function of
  ``(token, position)`` alone, so layer 0's ``ln1`` and fused QKV projection are computed
  once per distinct ``(token, position)`` pair (``d_vocab * n_pos`` rows) and gathered,
  instead of once per ``(example, position)`` (used when the table is smaller than the
  batch; :func:`readout_logits` ``table=``);
* the Q, K and V projections are one matmul (one concatenated weight).

It works on the bridge's own parameter tensors, addressed by their TransformerLens
state-dict keys (``blocks.0.attn.q.weight`` ...), so initialization, checkpoints, resume
files and analyses are those of the :class:`~transformer_lens.model_bridge.TransformerBridge`
(``boot_native``) it reads; only the order of floating-point operations differs from the
bridge's full forward (logits agree to ~1e-6 relative in float32, ~1e-15 in float64; see
``tests/runs/test_engine.py``). The same code takes a leading member dimension ``K`` on every
parameter (``[K, ...]``), so K seeds train together with batched matmuls.

A model the engine cannot express exactly (rotary or shortformer positions, ``solu_ln`` or
gated MLPs, RMS norms, soft caps, grouped-query attention, a non-default attention scale)
falls back to the bridge's forward, with one :class:`EngineFallbackWarning` per reason.

The matching optimizer is :func:`~interp_toolkit.runs.optim.adamw_step`, ``torch.optim.AdamW``'s
update written functionally for tensors with a member dimension. One model's forward over its
bridge's parameters (:class:`~interp_toolkit.runs.forward.ReadoutForward`,
:class:`~interp_toolkit.runs.forward.SequenceForward`) is in :mod:`interp_toolkit.runs.forward`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.runs.config import ENGINES, check_engine_name
from interp_toolkit.runs.cost import default_engine_chunk, members_per_pass

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    # The formulas of transformer_lens.model_bridge.sources.native.model._ACTIVATIONS.
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class EngineFallbackWarning(UserWarning):
    """The fast engine cannot express a model exactly; the bridge's forward is used."""


_warned: set[str] = set()


def warn_fallback_once(reason: str) -> None:
    """Warn (once per distinct ``reason`` per process) that the bridge forward is used."""
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(f"fast training engine not used ({reason}); falling back to the "
                  "TransformerBridge forward (slower, same results)", EngineFallbackWarning, stacklevel=3)


@dataclass(frozen=True)
class EngineSpec:
    """The architecture facts the engine's forward needs (all read from the model)."""

    n_layers: int
    n_heads: int
    d_head: int
    d_model: int
    d_mlp: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    act_fn: str
    layer_norm: bool
    attn_only: bool
    eps: float
    attn_scale: float


def engine_spec(model_cfg: Any, bridge_cfg: Any) -> tuple[EngineSpec | None, str | None]:
    """The :class:`EngineSpec` of a model, or ``(None, reason)`` if it is not expressible.

    Args:
        model_cfg: The toolkit's ``ModelConfig``.
        bridge_cfg: The bridge's ``TransformerBridgeConfig`` (``model.cfg``): the source of
            the LayerNorm eps, attention scale and every option the toolkit never sets.
    """
    checks = [
        (model_cfg.positional_embedding == "standard",
         f"positional_embedding={model_cfg.positional_embedding!r}"),
        (model_cfg.act_fn in _ACTIVATIONS, f"act_fn={model_cfg.act_fn!r}"),
        (model_cfg.normalization in ("LN", None), f"normalization={model_cfg.normalization!r}"),
        (str(getattr(bridge_cfg, "normalization_type", None) or "").upper() in ("LN", ""),
         f"bridge normalization_type={getattr(bridge_cfg, 'normalization_type', None)!r}"),
        (getattr(bridge_cfg, "attention_dir", "causal") == "causal", "non-causal attention"),
        (not getattr(bridge_cfg, "gated_mlp", False), "gated MLP"),
        (not getattr(bridge_cfg, "final_rms", False), "final RMS norm"),
        (float(getattr(bridge_cfg, "attn_scores_soft_cap", -1.0)) <= 0, "attention soft cap"),
        (float(getattr(bridge_cfg, "output_logits_soft_cap", -1.0)) <= 0, "logit soft cap"),
        (getattr(bridge_cfg, "n_key_value_heads", None) in (None, model_cfg.n_heads),
         "grouped-query attention"),
        (str(getattr(bridge_cfg, "positional_embedding_type", "standard") or "standard").lower()
         == "standard", "bridge positional embedding is not 'standard'"),
    ]
    for ok, reason in checks:
        if not ok:
            return None, reason
    use_scale = getattr(bridge_cfg, "use_attn_scale", True)
    attn_scale = float(getattr(bridge_cfg, "attn_scale", -1.0))
    # NativeAttention: cfg.attn_scale if use_attn_scale and attn_scale > 0, else sqrt(d_head).
    scale = attn_scale if (use_scale and attn_scale > 0) else math.sqrt(model_cfg.d_head)
    spec = EngineSpec(
        n_layers=model_cfg.n_layers, n_heads=model_cfg.n_heads, d_head=model_cfg.d_head,
        d_model=model_cfg.d_model, d_mlp=model_cfg.d_mlp, d_vocab=model_cfg.d_vocab,
        d_vocab_out=model_cfg.d_vocab_out, n_ctx=model_cfg.n_ctx,
        act_fn=model_cfg.act_fn, layer_norm=model_cfg.normalization == "LN",
        attn_only=model_cfg.attn_only, eps=float(getattr(bridge_cfg, "eps", 1e-5)), attn_scale=scale,
    )
    return spec, None


def state_dict_names(model: Any) -> dict[int, str]:
    """``id(tensor) -> TransformerLens state-dict key`` for every tensor of a bridge."""
    return {id(tensor): key for key, tensor in model.state_dict(keep_vars=True).items()}


def param_key_map(model: Any) -> dict[str, str]:
    """``raw parameter/buffer name -> state-dict key`` (e.g. ``layers.0._original_component
    .attn._original_component.q._original_component.weight -> blocks.0.attn.q.weight``)."""
    ids = state_dict_names(model)
    out = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in ids:
            out[name] = ids[id(tensor)]
    return out


# ----------------------------------------------------------------------------- forward


#: Use the batched (any-K) form of every op also for one member, so that stacked members
#: are bit-identical to single runs. False: plain ``F.linear`` / fused ``layer_norm`` for
#: K = 1 (measured 0-12% faster on a loaded 2-core machine, within its noise).
SAME_OPS_FOR_ANY_K = True

#: ``"padded"``: explicit scores and softmax with the key axis padded to a multiple of
#: :data:`KEY_PAD` by masked (``-inf``) keys; ``"sdpa"``: ``F.scaled_dot_product_attention``;
#: ``"matmul"``: explicit scores, mask and softmax as the bridge writes them. All three are
#: equal up to rounding. On CPU, torch's softmax over a last dim below 16 takes a scalar
#: path (measured, 1 thread, 49k rows: 10.9 ms forward + 5.4 ms backward over 11 keys,
#: 1.0 + 0.2 ms over 16), and the fused sdpa kernel does not pay for 11 positions either:
#: with the keys padded to 16, one causal layer-0 attention pass went from 45 ms (sdpa) to
#: the time ``benchmarks/bench_engine.py`` reports. Padded keys get probability exactly 0.
ATTENTION = "padded"

#: Key-axis padding of the ``"padded"`` attention (a multiple of the float32 vector width).
KEY_PAD = 16


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight.T + bias`` with a leading member dim: x [K, N, in], weight [K, out, in].

    The same batched kernels for every K: member k of a K-member pass computes exactly what
    a one-member pass computes (the K-seed trainer reproduces single runs bit for bit).
    """
    if x.shape[0] == 1 and not SAME_OPS_FOR_ANY_K:
        out = F.linear(x[0], weight[0], None if bias is None else bias[0])
        return out.unsqueeze(0)
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def _norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm over the last dim with per-member affine parameters ([K, D])."""
    if weight is None:
        return x
    assert bias is not None  # LayerNorm's weight and bias come together
    d = x.shape[-1]
    if x.shape[0] == 1 and not SAME_OPS_FOR_ANY_K:
        return F.layer_norm(x, (d,), weight[0], bias[0], eps)
    shape = (weight.shape[0],) + (1,) * (x.ndim - 2) + (d,)
    return torch.addcmul(bias.view(shape), F.layer_norm(x, (d,), None, None, eps), weight.view(shape))


class _Params:
    """Parameter lookup by state-dict key, with the member dim leading."""

    def __init__(self, params: Mapping[str, Tensor], spec: EngineSpec) -> None:
        self.p = params
        self.spec = spec

    def __getitem__(self, key: str) -> Tensor:
        return self.p[key]

    def ln(self, layer: int | None, which: str) -> tuple[Tensor | None, Tensor | None]:
        if not self.spec.layer_norm:
            return None, None
        prefix = "ln_final" if layer is None else f"blocks.{layer}.{which}"
        return self.p[f"{prefix}.weight"], self.p[f"{prefix}.bias"]

    def qkv(self, layer: int, parts: str = "qkv") -> tuple[Tensor, Tensor]:
        """Concatenated ``[K, len(parts) * H * d_head, d_model]`` weight and its bias."""
        prefix = f"blocks.{layer}.attn"
        if len(parts) == 1:
            return self.p[f"{prefix}.{parts}.weight"], self.p[f"{prefix}.{parts}.bias"]
        weight = torch.cat([self.p[f"{prefix}.{c}.weight"] for c in parts], dim=1)
        bias = torch.cat([self.p[f"{prefix}.{c}.bias"] for c in parts], dim=1)
        return weight, bias


def _mlp(x: Tensor, p: _Params, layer: int) -> Tensor:
    """Residual after the MLP of ``layer`` (x: [K, N, D])."""
    spec = p.spec
    if spec.attn_only:
        return x
    w, b = p.ln(layer, "ln2")
    h = _norm(x, w, b, spec.eps)
    mid = _ACTIVATIONS[spec.act_fn](_linear(h, p[f"blocks.{layer}.mlp.in.weight"], p[f"blocks.{layer}.mlp.in.bias"]))
    return x + _linear(mid, p[f"blocks.{layer}.mlp.out.weight"], p[f"blocks.{layer}.mlp.out.bias"])


def _heads(x: Tensor, rows: int, pos: int, spec: EngineSpec) -> Tensor:
    """[K, rows*pos, H*dh] -> [K*rows, H, pos, dh] (a view)."""
    return x.reshape(-1, pos, spec.n_heads, spec.d_head).transpose(1, 2)


def _score_mask(n_query: int, n_key: int, width: int, causal: bool, like: Tensor) -> Tensor:
    """Additive ``[n_query, width]`` mask: 0 where query i may see key j, ``-inf`` elsewhere
    (keys after i when ``causal``, the ``width - n_key`` padding keys always). The queries are
    the last ``n_query`` of the ``n_key`` positions."""
    query_pos = torch.arange(n_key - n_query, n_key, device=like.device).unsqueeze(1)
    key_pos = torch.arange(width, device=like.device).unsqueeze(0)
    hidden = key_pos >= n_key
    if causal:
        hidden = hidden | (key_pos > query_pos)
    zeros = torch.zeros(n_query, width, dtype=like.dtype, device=like.device)
    return zeros.masked_fill(hidden, float("-inf"))


def _attention(q: Tensor, k: Tensor, v: Tensor, spec: EngineSpec, causal: bool) -> Tensor:
    """Softmax attention [KB, H, Tq, dh]: scores / scale, causal mask when ``causal``."""
    if ATTENTION == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0 / spec.attn_scale)
    if ATTENTION == "padded":
        batch, heads, n_query, d_head = q.shape
        n_key = k.shape[-2]
        width = -(-n_key // KEY_PAD) * KEY_PAD
        pad = (0, 0, 0, width - n_key)  # zero keys and values after the last position
        k_pad = F.pad(k, pad).reshape(batch * heads, width, d_head)
        v_pad = F.pad(v, pad).reshape(batch * heads, width, d_head)
        mask = _score_mask(n_query, n_key, width, causal, q)
        scores = torch.baddbmm(mask, q.reshape(batch * heads, n_query, d_head), k_pad.transpose(1, 2),
                               alpha=1.0 / spec.attn_scale)
        return torch.bmm(torch.softmax(scores, dim=-1), v_pad).view(batch, heads, n_query, d_head)
    scores = torch.matmul(q, k.transpose(-2, -1)) / spec.attn_scale
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _causal_attention(qkv: Tensor, spec: EngineSpec, k_members: int, batch: int, pos: int) -> Tensor:
    """Causal self-attention of every position: qkv [K, B*T, 3*H*dh] -> [K, B*T, H*dh]."""
    width = spec.n_heads * spec.d_head
    q, k, v = (_heads(t, batch, pos, spec) for t in qkv.split(width, dim=-1))
    z = _attention(q, k, v, spec, causal=True)  # [KB, H, T, dh]
    return z.transpose(1, 2).reshape(k_members, batch * pos, width)


def _readout_attention(q: Tensor, kv: Tensor, spec: EngineSpec, k_members: int, batch: int, pos: int) -> Tensor:
    """The readout query over every key: q [K, B, H*dh], kv [K, B*T, 2*H*dh] -> [K, B, H*dh]."""
    width = spec.n_heads * spec.d_head
    k, v = (_heads(t, batch, pos, spec) for t in kv.split(width, dim=-1))
    q = q.reshape(-1, 1, spec.n_heads, spec.d_head).transpose(1, 2)  # [KB, H, 1, dh]
    z = _attention(q, k, v, spec, causal=False)  # the readout is the last position kept
    return z.reshape(k_members, batch, width)


def readout_logits(
    spec: EngineSpec,
    params: Mapping[str, Tensor],
    tokens: Int[Tensor, "batch pos"],
    position: int = -1,
    table: bool | None = None,
) -> Float[Tensor, "member batch vocab_out"]:
    """Logits at the readout position of K stacked members of one architecture.

    Args:
        spec: The architecture (:func:`engine_spec`).
        params: Every parameter by TransformerLens state-dict key (plus the ``unembed.bias``
            buffer), each with a leading member dimension ``K``.
        tokens: Inputs shared by all members.
        position: Readout position (negative counts from the end, as in ``logits[:, position]``).
        table: Compute layer 0's ``ln1`` + QKV once per ``(token, position)`` pair and gather
            (``None``: when the table has fewer rows than a quarter of the batch's positions).

    Returns:
        ``[K, batch, d_vocab_out]`` logits, equal to the bridge's ``model(tokens)[:, position]``
        up to floating-point rounding.
    """
    n_pos = tokens.shape[1]
    if not -n_pos <= position < n_pos:
        raise UserError(f"readout position {position} is outside sequences of length {n_pos}")
    if n_pos > spec.n_ctx:
        raise UserError(f"input length {n_pos} exceeds the model's n_ctx={spec.n_ctx}")
    readout = position % n_pos
    pos = readout + 1  # causal: positions after the readout never reach its logits
    tokens = tokens[:, :pos]
    batch = tokens.shape[0]
    p = _Params(params, spec)
    embed = params["embed.weight"]  # [K, V, D]
    k_members, d_vocab, d_model = embed.shape
    pos_embed = params["pos_embed.weight"][:, :pos]  # [K, T, D]
    last = spec.n_layers - 1
    if table is None:
        table = 4 * d_vocab * pos <= batch * pos
    position_ids = torch.arange(pos, device=tokens.device)
    flat = tokens.reshape(-1)
    readout_rows = None

    # ---- layer 0's input, its ln1 and its projections (from the (token, position) table)
    parts0 = "kv" if last == 0 else "qkv"
    w_ln, b_ln = p.ln(0, "ln1")
    w_proj, b_proj = p.qkv(0, parts0)
    if table:
        x_table = (embed.unsqueeze(2) + pos_embed.unsqueeze(1)).reshape(k_members, d_vocab * pos, d_model)
        h_table = _norm(x_table, w_ln, b_ln, spec.eps)
        rows = flat * pos + position_ids.repeat(batch)  # row of (token, position) in the table
        proj = _linear(h_table, w_proj, b_proj).index_select(1, rows)  # [K, B*T, parts*H*dh]
        if last == 0:
            readout_rows = tokens[:, readout] * pos + readout
            x_r = x_table.index_select(1, readout_rows)  # [K, B, D]
            q_w, q_b = p.qkv(0, "q")
            q = _linear(h_table, q_w, q_b).index_select(1, readout_rows)  # [K, B, H*dh]
        else:
            x = x_table.index_select(1, rows)  # [K, B*T, D]
    else:
        x = (embed.index_select(1, flat).view(k_members, batch, pos, d_model)
             + pos_embed.unsqueeze(1)).view(k_members, batch * pos, d_model)
        h = _norm(x, w_ln, b_ln, spec.eps)
        proj = _linear(h, w_proj, b_proj)
        if last == 0:
            x_r = x.view(k_members, batch, pos, d_model)[:, :, readout]
            q_w, q_b = p.qkv(0, "q")
            q = _linear(h.view(k_members, batch, pos, d_model)[:, :, readout], q_w, q_b)

    # ---- layers below the last: every position
    for layer in range(last):
        if layer > 0:
            w_ln, b_ln = p.ln(layer, "ln1")
            w_proj, b_proj = p.qkv(layer, "qkv")
            proj = _linear(_norm(x, w_ln, b_ln, spec.eps), w_proj, b_proj)
        z = _causal_attention(proj, spec, k_members, batch, pos)
        x = x + _linear(z, p[f"blocks.{layer}.attn.o.weight"], p[f"blocks.{layer}.attn.o.bias"])
        x = _mlp(x, p, layer)

    # ---- last layer: keys and values everywhere, everything else at the readout only
    if last > 0:
        w_ln, b_ln = p.ln(last, "ln1")
        h = _norm(x, w_ln, b_ln, spec.eps)
        w_kv, b_kv = p.qkv(last, "kv")
        proj = _linear(h, w_kv, b_kv)
        x_r = x.view(k_members, batch, pos, d_model)[:, :, readout]
        q_w, q_b = p.qkv(last, "q")
        q = _linear(h.view(k_members, batch, pos, d_model)[:, :, readout], q_w, q_b)
    z = _readout_attention(q, proj, spec, k_members, batch, pos)
    x_r = x_r + _linear(z, p[f"blocks.{last}.attn.o.weight"], p[f"blocks.{last}.attn.o.bias"])
    x_r = _mlp(x_r, p, last)
    w_ln, b_ln = p.ln(None, "")
    return _linear(_norm(x_r, w_ln, b_ln, spec.eps), params["unembed.weight"], params.get("unembed.bias"))


def sequence_logits(
    spec: EngineSpec,
    params: Mapping[str, Tensor],
    tokens: Int[Tensor, "batch pos"],
    table: bool | None = None,
) -> Float[Tensor, "batch pos vocab_out"]:
    """Logits at every position of one model (a language model's forward).

    The bridge's computation with every layer at every position (a next-token loss needs
    them all), without hook points or per-component dispatch: fused QKV projection, one
    batched attention per layer with the causal mask added to the scores.

    Args:
        spec: The architecture (:func:`engine_spec`).
        params: Every parameter by TransformerLens state-dict key (plus the ``unembed.bias``
            buffer), without a member dimension.
        tokens: Input token ids.
        table: Compute layer 0's ``ln1`` + QKV once per ``(token, position)`` pair and
            gather, as :func:`readout_logits` does (``None``: when the table has at most half
            the rows of the batch).

    Returns:
        ``[batch, pos, d_vocab_out]`` logits, equal to the bridge's ``model(tokens)`` up to
        floating-point rounding (``tests/runs/test_engine.py``).
    """
    batch, pos = tokens.shape
    if pos > spec.n_ctx:
        raise UserError(f"input length {pos} exceeds the model's n_ctx={spec.n_ctx}")
    heads, d_head, d_model = spec.n_heads, spec.d_head, spec.d_model
    if table is None:
        table = 2 * spec.d_vocab <= batch
    in_place = not torch.is_grad_enabled()  # no graph to keep intermediates for: reuse buffers

    def norm(x: Tensor, prefix: str) -> Tensor:
        if not spec.layer_norm:
            return x
        return F.layer_norm(x, (d_model,), params[f"{prefix}.weight"], params[f"{prefix}.bias"], spec.eps)

    x = F.embedding(tokens, params["embed.weight"]) + params["pos_embed.weight"][:pos]
    # keys padded to a multiple of KEY_PAD (masked): softmax over a short last dim is slow on CPU
    width = -(-pos // KEY_PAD) * KEY_PAD
    mask = _score_mask(pos, pos, width, causal=True, like=x)
    for layer in range(spec.n_layers):
        prefix = f"blocks.{layer}"
        weight = torch.cat([params[f"{prefix}.attn.{c}.weight"] for c in "qkv"])
        bias = torch.cat([params[f"{prefix}.attn.{c}.bias"] for c in "qkv"])
        if layer == 0 and table:
            # layer 0's input is a function of (token, position): ln1 + QKV once per pair, gathered
            x_table = (params["embed.weight"].unsqueeze(1) + params["pos_embed.weight"][:pos]).reshape(-1, d_model)
            rows = (tokens * pos + torch.arange(pos, device=tokens.device)).reshape(-1)
            qkv = F.linear(norm(x_table, f"{prefix}.ln1"), weight, bias).index_select(0, rows)
        else:
            qkv = F.linear(norm(x, f"{prefix}.ln1"), weight, bias)
        q, k, v = qkv.view(batch, pos, 3, heads, d_head).permute(2, 0, 3, 1, 4)
        k, v = (F.pad(t, (0, 0, 0, width - pos)).reshape(batch * heads, width, d_head) for t in (k, v))
        scores = torch.baddbmm(mask, q.reshape(batch * heads, pos, d_head), k.transpose(1, 2),
                               alpha=1.0 / spec.attn_scale)
        z = torch.bmm(torch.softmax(scores, dim=-1), v)
        z = z.view(batch, heads, pos, d_head).transpose(1, 2).reshape(batch, pos, heads * d_head)
        attn_out = F.linear(z, params[f"{prefix}.attn.o.weight"], params[f"{prefix}.attn.o.bias"])
        x = attn_out.add_(x) if in_place else x + attn_out
        if not spec.attn_only:
            hidden = F.linear(
                norm(x, f"{prefix}.ln2"), params[f"{prefix}.mlp.in.weight"], params[f"{prefix}.mlp.in.bias"]
            )
            hidden = hidden.relu_() if in_place and spec.act_fn == "relu" else _ACTIVATIONS[spec.act_fn](hidden)
            mlp_out = F.linear(hidden, params[f"{prefix}.mlp.out.weight"], params[f"{prefix}.mlp.out.bias"])
            x = mlp_out.add_(x) if in_place else x + mlp_out
    return F.linear(norm(x, "ln_final"), params["unembed.weight"], params.get("unembed.bias"))


def member_losses(
    logits: Float[Tensor, "member batch vocab_out"], labels: Int[Tensor, " batch"], divisor: int | None = None
) -> Float[Tensor, " member"]:
    """Per-member cross-entropy: the mean over the batch, or the sum divided by ``divisor``."""
    k_members, batch, vocab = logits.shape
    if divisor is None and k_members == 1 and not SAME_OPS_FOR_ANY_K:
        return F.cross_entropy(logits[0], labels).unsqueeze(0)
    losses = F.cross_entropy(logits.reshape(k_members * batch, vocab), labels.repeat(k_members), reduction="none")
    return losses.view(k_members, batch).sum(1) / (divisor or batch)


def member_eval_sums(
    logits: Float[Tensor, "member batch vocab_out"], labels: Int[Tensor, " batch"]
) -> tuple[Float[Tensor, " member"], Int[Tensor, " member"]]:
    """Per member: the summed cross-entropy (float64, on the CPU) and the number of correct
    argmaxes over one batch. Every evaluation (one run's and K stacked members') reduces by
    these same ops, so a run's metrics are the same bytes whether it trained alone or stacked."""
    k_members, batch, vocab = logits.shape
    losses = F.cross_entropy(logits.reshape(k_members * batch, vocab), labels.repeat(k_members), reduction="none")
    return losses.view(k_members, batch).sum(1).double().cpu(), (logits.argmax(-1) == labels).sum(-1).cpu()


# ----------------------------------------------------------------------------- many members


def stacked_grads(
    spec: EngineSpec,
    params: Mapping[str, Tensor],
    constants: Mapping[str, Tensor],
    tokens: Int[Tensor, "batch pos"],
    labels: Int[Tensor, " batch"],
    position: int,
    chunk_size: int | None = None,
) -> tuple[dict[str, Tensor], Float[Tensor, " member"]]:
    """Gradients and mean cross-entropies of K stacked members on one batch.

    Each member's gradient is computed by the passes a single run of it makes
    (:meth:`ReadoutForward.backward` with the same ``chunk_size``), so it equals that
    run's bit for bit; members are grouped per pass by :func:`members_per_pass`.

    Args:
        spec: The architecture.
        params: Trainable tensors by state-dict key, each ``[K, ...]`` (not modified).
        constants: Non-trainable tensors by state-dict key (the ``unembed.bias`` buffer).
        tokens, labels: The batch, shared by every member.
        position: Readout position.
        chunk_size: Examples per pass (default: a single run's, :func:`default_engine_chunk`
            for one member, on a CPU; on a GPU, for all K members).

    Returns:
        ``(grads, losses)``: ``grads[key]`` is ``[K, ...]`` like ``params[key]``; ``losses``
        is ``[K]``, each member's mean loss over the batch.
    """
    n = labels.shape[0]
    n_pos = tokens.shape[1]
    k_members = next(iter(params.values())).shape[0]
    on_cpu = tokens.device.type == "cpu"
    chunk = chunk_size or default_engine_chunk(1 if on_cpu else k_members, n, tokens.device, spec, n_pos)
    group = members_per_pass(k_members, min(chunk, n), n_pos, tokens.device)
    grad_parts: list[list[Tensor]] = []
    loss_parts: list[Tensor] = []
    for first in range(0, k_members, group):
        leaves = {key: p[first : first + group].detach().requires_grad_(True) for key, p in params.items()}
        inputs = {**{key: c[first : first + group] for key, c in constants.items()}, **leaves}
        grads: list[Tensor] | None = None
        losses: Tensor | None = None
        for start in range(0, n, chunk):
            logits = readout_logits(spec, inputs, tokens[start : start + chunk], position)
            part = member_losses(logits, labels[start : start + chunk], divisor=None if chunk >= n else n)
            part_grads = torch.autograd.grad(part.sum(), list(leaves.values()))
            if grads is None or losses is None:
                grads, losses = list(part_grads), part.detach()
            else:
                torch._foreach_add_(grads, part_grads)
                losses = losses + part.detach()
        assert grads is not None and losses is not None
        grad_parts.append(grads)
        loss_parts.append(losses)
    if len(grad_parts) == 1:
        return dict(zip(params, grad_parts[0], strict=True)), loss_parts[0]
    stacked = [torch.cat(parts) for parts in zip(*grad_parts, strict=True)]
    return dict(zip(params, stacked, strict=True)), torch.cat(loss_parts)


@torch.no_grad()
def stacked_logits(spec: EngineSpec, tensors: Mapping[str, Tensor], tokens: Int[Tensor, "batch pos"],
                   position: int) -> Float[Tensor, "member batch vocab_out"]:
    """Readout logits of K stacked members (evaluation)."""
    return readout_logits(spec, tensors, tokens, position)


__all__ = [
    "ENGINES", "EngineFallbackWarning", "EngineSpec", "check_engine_name", "engine_spec", "member_eval_sums",
    "member_losses", "param_key_map", "readout_logits", "stacked_grads", "stacked_logits", "state_dict_names",
    "warn_fallback_once",
]
