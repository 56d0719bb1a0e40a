"""Does a run's outcome depend on float rounding? One seed, one setting, several numerics.

Every mode starts from the same weights (the toolkit's initialization of ``seed``), sees the
same minibatches (the toolkit's shuffle of ``seed``) and steps ``torch.optim.AdamW`` with the
same settings; only the arithmetic differs:

* ``toolkit``: the toolkit's lean readout forward (what ``interp-toolkit train`` uses);
* ``toolkit-bridge``: the TransformerBridge's own forward;
* ``bare``: :class:`interp_toolkit.runs.reference.BareModel`, a plain PyTorch module of the same
  architecture (``scaled_dot_product_attention``) loaded with the toolkit's weights; its
  logits equal the bridge's to float rounding;
* ``bare-manual``: the same, with attention written as matmul + softmax;
* ``bare-float64``: the bare module in double precision.

A last evaluation at adversarial accuracy :data:`NEAR_MISS_FROM` to 1 also names the groups
its wrong adversarial examples fall in (e.g. ``n_odd=8 (13 of 13 wrong)``: the near-miss
analysis of :mod:`interp_toolkit.analyses.near_misses`).
``examples/reproduction/regime/rounding_probe.py`` is its command line.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from interp_toolkit.analyses.near_misses import describe_groups, failing_groups, near_misses
from interp_toolkit.errors import UserError
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.runs.forward import ReadoutForward
from interp_toolkit.runs.reference import BareModel
from interp_toolkit.tasks.mpsp import MPSPConfig, is_extreme_count, make_splits

MODES = ("toolkit", "toolkit-bridge", "bare", "bare-manual", "bare-float64")
#: A final evaluation at or above this adversarial accuracy (and below 1) also names the
#: groups that hold the wrong adversarial examples (``adv_wrong``, ``adv_failing_groups``).
NEAR_MISS_FROM = 0.9


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
        raise UserError(f"mode must be one of {MODES}, got {mode!r}")
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
