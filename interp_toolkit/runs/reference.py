"""An independent forward of the toolkit's MPSP architecture, in plain PyTorch.

:class:`BareModel` is the architecture :func:`interp_toolkit.model.build_model` builds by
default (pre-LayerNorm blocks, learned positions, causal attention, a ReLU MLP, logits at the
last position) written without TransformerLens or the lean engine: the reference that
``tests/runs/test_reference.py`` checks the bridge's logits and the engine's gradients
against, and the "bare" numerics of the rounding probe
(:mod:`interp_toolkit.studies.rounding_probe`). It loads and returns the toolkit's state dict
(TransformerLens key names), so the same weights run through either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp_toolkit.errors import UserError
from interp_toolkit.model import ModelConfig

__all__ = ["BareBlock", "BareModel", "manual_attention"]


def manual_attention(q: Float[Tensor, "batch head pos d_head"], k: Float[Tensor, "batch head pos d_head"],
                     v: Float[Tensor, "batch head pos d_head"]) -> Float[Tensor, "batch head pos d_head"]:
    """Causal attention written as matmul, mask and softmax (no fused kernel)."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v


class BareBlock(nn.Module):
    """Pre-LayerNorm block: causal multi-head attention, then a ReLU MLP."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int, manual_attention: bool = False) -> None:
        super().__init__()
        self.n_heads, self.manual = n_heads, manual_attention
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.fc_in, self.fc_out = nn.Linear(d_model, d_mlp), nn.Linear(d_mlp, d_model)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        batch, pos, width = x.shape
        h = self.ln1(x)
        q, k, v = (lin(h).view(batch, pos, self.n_heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
        z = manual_attention(q, k, v) if self.manual else F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(z.transpose(1, 2).reshape(batch, pos, width))
        return x + self.fc_out(F.relu(self.fc_in(self.ln2(x))))


class BareModel(nn.Module):
    """The toolkit's MPSP architecture as a plain module: logits at the last position."""

    def __init__(self, cfg: ModelConfig, manual_attention: bool = False) -> None:
        super().__init__()
        assert cfg.d_vocab_out is not None  # ModelConfig fills it in
        if cfg.act_fn != "relu" or cfg.normalization != "LN" or cfg.attn_only or cfg.positional_embedding != "standard":
            raise UserError(f"BareModel writes the default architecture (relu, LN, an MLP, learned positions); "
                            f"got act_fn={cfg.act_fn!r}, normalization={cfg.normalization!r}, "
                            f"attn_only={cfg.attn_only!r}, positional_embedding={cfg.positional_embedding!r}")
        self.embed, self.pos = nn.Embedding(cfg.d_vocab, cfg.d_model), nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.blocks = nn.ModuleList(BareBlock(cfg.d_model, cfg.n_heads, cfg.d_mlp, manual_attention)
                                    for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab_out, bias=False)  # TransformerLens 4: a fixed zero bias

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab_out"]:
        x = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.ln_final(x[:, -1]))

    def load_toolkit_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a toolkit model's state dict (TransformerLens key names) into this module."""
        own = dict(self.named_parameters())
        with torch.no_grad():
            for ours, theirs in self._toolkit_names().items():
                own[ours].copy_(state[theirs])

    def toolkit_state(self) -> dict[str, torch.Tensor]:
        """This module's weights under the toolkit's (TransformerLens) key names, in float32."""
        own = dict(self.named_parameters())
        return {theirs: own[ours].detach().float() for ours, theirs in self._toolkit_names().items()}

    def _toolkit_names(self) -> dict[str, str]:
        names = {"embed.weight": "embed.weight", "pos.weight": "pos_embed.weight",
                 "ln_final.weight": "ln_final.weight", "ln_final.bias": "ln_final.bias",
                 "unembed.weight": "unembed.weight"}
        for i in range(len(self.blocks)):
            for ours, theirs in (("ln1", "ln1"), ("ln2", "ln2"), ("q", "attn.q"), ("k", "attn.k"), ("v", "attn.v"),
                                 ("o", "attn.o"), ("fc_in", "mlp.in"), ("fc_out", "mlp.out")):
                for kind in ("weight", "bias"):
                    names[f"blocks.{i}.{ours}.{kind}"] = f"blocks.{i}.{theirs}.{kind}"
        own = set(dict(self.named_parameters()))
        if own != set(names):
            raise UserError(f"bare module parameters {sorted(own ^ set(names))} have no toolkit counterpart")
        return names
