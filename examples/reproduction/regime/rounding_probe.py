"""Does a run's outcome depend on float rounding? One seed, one setting, several numerics.

Every mode starts from the same weights (the toolkit's initialization of ``--seed``), sees the
same minibatches (the toolkit's shuffle of ``--seed``) and steps ``torch.optim.AdamW`` with the
same settings; only the arithmetic differs:

* ``toolkit``: the toolkit's lean readout forward (what ``interp-toolkit train`` uses);
* ``toolkit-bridge``: the TransformerBridge's own forward;
* ``bare``: a plain PyTorch module of the same architecture (``scaled_dot_product_attention``),
  loaded with the toolkit's weights; its logits equal the bridge's to float rounding;
* ``bare-manual``: the same, with attention written as matmul + softmax;
* ``bare-float64``: the bare module in double precision.

    python examples/reproduction/regime/rounding_probe.py --mode toolkit --seed 0 --out probe.jsonl

Appends one JSON line per evaluation (mode, seed, epoch, train/val/adv accuracy) to ``--out``;
a last evaluation at adversarial accuracy 0.9-1 also names the groups its wrong adversarial
examples fall in (e.g. ``n_odd=8 (13 of 13 wrong)``: the near-miss analysis of
``interp_toolkit.analyses.near_misses``);
``--stop-at`` ends a run once adversarial accuracy reaches it (to save CPU). The regime defaults
are stage 1e's (2 layers, 2 heads, length 8, r = 0.9, batch 512, lr 1e-3, wd 1.0, betas
(0.9, 0.98)); they are this project's choices, not the paper's.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from interp_toolkit.analyses.near_misses import describe_groups, failing_groups, near_misses
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.runs.engine import ReadoutForward
from interp_toolkit.tasks.mpsp import MPSPConfig, is_extreme_count, make_splits

MODES = ("toolkit", "toolkit-bridge", "bare", "bare-manual", "bare-float64")
#: A final evaluation at or above this adversarial accuracy (and below 1) also names the
#: groups that hold the wrong adversarial examples (``adv_wrong``, ``adv_failing_groups``).
NEAR_MISS_FROM = 0.9


def _manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, pos, width = x.shape
        h = self.ln1(x)
        q, k, v = (lin(h).view(batch, pos, self.n_heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
        z = _manual_attention(q, k, v) if self.manual else F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(z.transpose(1, 2).reshape(batch, pos, width))
        return x + self.fc_out(F.relu(self.fc_in(self.ln2(x))))


class BareModel(nn.Module):
    """The toolkit's MPSP architecture as a plain module: logits at the last position."""

    def __init__(self, cfg: ModelConfig, manual_attention: bool = False) -> None:
        super().__init__()
        assert cfg.d_vocab_out is not None  # ModelConfig fills it in
        self.embed, self.pos = nn.Embedding(cfg.d_vocab, cfg.d_model), nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.blocks = nn.ModuleList(BareBlock(cfg.d_model, cfg.n_heads, cfg.d_mlp, manual_attention)
                                    for _ in range(cfg.n_layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab_out, bias=False)  # TransformerLens 4: a fixed zero bias

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
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
            raise ValueError(f"bare module parameters {sorted(own ^ set(names))} have no toolkit counterpart")
        return names


def probe(mode: str, seed: int, epochs: int, task: MPSPConfig, n_layers: int = 2, n_heads: int = 2,
          lr: float = 1e-3, weight_decay: float = 1.0, batch_size: int = 512, eval_every: int = 10,
          stop_at: float | None = None, then_extreme_train: int | None = None,
          then_epochs: int = 0) -> list[dict[str, Any]]:
    """Train one run in ``mode``; return its evaluations (epoch, train/val/adv accuracy, and
    ``adv_extreme_acc``: accuracy on the adversarial split's extreme-count sequences, all odd for
    parity tasks).

    With ``then_epochs``, training goes on from where it stopped for that many epochs on a
    training split holding exactly ``then_extreme_train`` extreme-count sequences
    (``MPSPConfig.extreme_train``, a departure; same val and adv splits), rows marked
    ``"continued": True``: does a model that learned the rule everywhere but the extreme count
    learn it there once the training split shows it? Compare with ``then_extreme_train=None``
    (the same continuation on the original split).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    splits = make_splits(task)
    extreme_adv = is_extreme_count(splits["adv"].values, task.modulus)
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, seed=seed, **task.model_dims())
    toolkit_model = build_model(cfg).train()
    forward: Any
    if mode.startswith("toolkit"):
        forward = ReadoutForward(toolkit_model, -1, "fast" if mode == "toolkit" else "bridge")
        params = list(toolkit_model.parameters())

        def loss_backward(tokens: torch.Tensor, labels: torch.Tensor) -> None:
            forward.backward(tokens, labels)
    else:
        forward = BareModel(cfg, manual_attention=mode == "bare-manual")
        forward.load_toolkit_weights({k: v.detach() for k, v in toolkit_model.state_dict().items()})
        if mode == "bare-float64":
            forward.double()
        params = list(forward.parameters())

        def loss_backward(tokens: torch.Tensor, labels: torch.Tensor) -> None:
            F.cross_entropy(forward(tokens), labels).backward()
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    shuffle = torch.Generator().manual_seed(seed)  # the toolkit's epoch_minibatches order
    rows: list[dict[str, Any]] = []

    def evaluate(epoch: int, continued: bool) -> dict[str, Any]:
        row: dict[str, Any] = {"mode": mode, "seed": seed, "epoch": epoch}
        if continued:
            row.update(continued=True, extreme_train=then_extreme_train)
        with torch.no_grad():
            for name, split in splits.items():
                right = forward(split.tokens).argmax(-1) == split.labels
                row[f"{name}_acc"] = right.float().mean().item()
                if name == "adv":  # None when the split has no extreme-count sequence
                    row["adv_extreme_acc"] = right[extreme_adv].float().mean().item() if extreme_adv.any() else None
        rows.append(row)
        return row

    def train_epochs(first: int, last: int, train: Any, continued: bool) -> None:
        for epoch in range(first, last + 1):
            for index in torch.randperm(len(train.labels), generator=shuffle).split(batch_size):
                optimizer.zero_grad(set_to_none=True)
                loss_backward(train.tokens[index], train.labels[index])
                optimizer.step()
            if epoch % eval_every == 0 or epoch == last:
                row = evaluate(epoch, continued)
                if not continued and stop_at is not None and row["adv_acc"] >= stop_at:
                    return

    train_epochs(1, epochs, splits["train"], continued=False)
    if then_epochs:
        stopped = rows[-1]["epoch"]
        then_train = make_splits(replace(task, extreme_train=then_extreme_train))["train"]
        train_epochs(stopped + 1, stopped + then_epochs, then_train, continued=True)
    if NEAR_MISS_FROM <= rows[-1]["adv_acc"] < 1.0:
        if not mode.startswith("toolkit"):  # the bare weights, back in the toolkit's model
            toolkit_model.load_state_dict(forward.toolkit_state(), strict=False)
        found = near_misses(toolkit_model.eval(), splits, ["adv"])
        rows[-1]["adv_wrong"] = int(found.tensors["adv_wrong"].sum())
        rows[-1]["adv_failing_groups"] = describe_groups(failing_groups(list(found.table), "adv"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=1.0)
    parser.add_argument("--r", type=float, default=0.9)
    parser.add_argument("--stop-at", type=float, default=0.9)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--then-epochs", type=int, default=0,
                        help="then train this many more epochs on a split with --then-extreme-train all-odd sequences")
    parser.add_argument("--then-extreme-train", type=int, default=None,
                        help="all-odd training sequences of the continuation (default: the original split)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    task = MPSPConfig.from_task("max_parity_sum_parity", r=args.r, seq_len=8, n_values=10, n_train=16_384,
                                n_eval=2_048, seed=0)
    rows = probe(args.mode, args.seed, args.epochs, task, weight_decay=args.weight_decay, stop_at=args.stop_at,
                 eval_every=args.eval_every, then_extreme_train=args.then_extreme_train, then_epochs=args.then_epochs)
    with args.out.open("a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    print(json.dumps(rows[-1]))


if __name__ == "__main__":
    main()
