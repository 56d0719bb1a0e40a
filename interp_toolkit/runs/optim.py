"""The optimizer step of the stacked trainer: ``torch.optim.AdamW``'s update on lists of
(stacked) tensors (:func:`adamw_step`, bit-identical to torch's ``foreach`` path) and per-member
gradient-norm clipping (:func:`clip_member_grads_`), and :class:`StackedAdamW`, the optimizer
state of K stacked members that steps with it."""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which train() uses


@torch.no_grad()
def adamw_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    step: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    eps: float = 1e-8,
) -> None:
    """One ``torch.optim.AdamW`` step, in place, on lists of tensors (any shapes, e.g. stacked).

    The update of ``torch.optim.AdamW`` (``foreach`` path, ``amsgrad=False``,
    ``maximize=False``): decoupled weight decay, ``exp_avg.lerp_``, bias corrections of
    step ``step`` (1 for the first step), ``eps`` added after the bias-corrected root.
    """
    beta1, beta2 = betas
    params, grads, exp_avgs, exp_avg_sqs = list(params), list(grads), list(exp_avgs), list(exp_avg_sqs)
    if weight_decay != 0:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    # Python floats, computed as torch.optim.adam._multi_tensor_adam does (bit-identical).
    bias_correction1 = 1 - beta1 ** float(step)
    bias_correction2_sqrt = (1 - beta2 ** float(step)) ** 0.5
    step_size = (lr / bias_correction1) * -1
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, step_size)


@torch.no_grad()
def clip_member_grads_(grads: Mapping[str, Tensor], max_norm: float) -> Float[Tensor, " members"]:
    """Clip each member's gradient to global norm ``max_norm``, in place, as
    ``torch.nn.utils.clip_grad_norm_`` clips one model's: every tensor of member k is multiplied
    by ``min(1, max_norm / (norm_k + 1e-6))``, with ``norm_k`` the 2-norm over all of member k's
    tensors (each ``[K, ...]``). Returns the norms before clipping."""
    tensors = list(grads.values())
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in tensors])  # [tensors, K]
    total = torch.linalg.vector_norm(norms, dim=0)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in tensors:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))
    return total


class StackedAdamW:
    """AdamW on stacked parameters ``{name: [K, ...]}``, the update of ``torch.optim.AdamW``.

    Args:
        lr: Learning rate.
        betas: ``(beta1, beta2)``.
        weight_decay: Decoupled weight decay.
        eps: Added to the bias-corrected root of the second moment.
    """

    def __init__(self, params: Mapping[str, Tensor], lr: float, betas: tuple[float, float],
                 weight_decay: float, eps: float = ADAM_EPS) -> None:
        self.lr, self.betas, self.weight_decay, self.eps = lr, betas, weight_decay, eps
        self.step_count = 0
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: Mapping[str, Tensor], lr: float | None = None) -> None:
        """Update ``params`` in place from ``grads`` (same keys and shapes), at ``lr`` (default
        the constructor's: a schedule passes each step's rate, as ``train`` sets its optimizer's)."""
        self.step_count += 1
        names = list(params)
        adamw_step([params[k] for k in names], [grads[k] for k in names], [self.exp_avg[k] for k in names],
                   [self.exp_avg_sq[k] for k in names], self.step_count, self.lr if lr is None else lr, self.betas,
                   self.weight_decay, self.eps)

    def select(self, keep: Tensor) -> None:
        """Keep only the members indexed by ``keep`` (after others stopped early)."""
        self.exp_avg = {k: v[keep].contiguous() for k, v in self.exp_avg.items()}
        self.exp_avg_sq = {k: v[keep].contiguous() for k, v in self.exp_avg_sq.items()}

    def member_state_dict(self, index: int, param_names: Sequence[str],
                          param_groups: list[dict[str, Any]]) -> dict[str, Any]:
        """Member ``index``'s state in ``torch.optim.AdamW.state_dict()`` format."""
        state = {
            i: {
                "step": torch.tensor(float(self.step_count)),
                "exp_avg": self.exp_avg[name][index].clone(),
                "exp_avg_sq": self.exp_avg_sq[name][index].clone(),
            }
            for i, name in enumerate(param_names)
        }
        return {"state": state, "param_groups": copy.deepcopy(param_groups)}

__all__ = ["adamw_step", "clip_member_grads_", "StackedAdamW"]
