"""Data helpers: lengths, indexing, fingerprints and per-example losses of any DataLike."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor, nn

from interp_toolkit.errors import UserError
from interp_toolkit.io import tensor_digest

DataLike = Union[Tensor, Sequence[Tensor], Mapping[str, Tensor]]
LossFn = Callable[[nn.Module, Any], Tensor]
Observable = Callable[[nn.Module], Tensor]



# --------------------------------------------------------------------------- data helpers


def data_length(data: DataLike) -> int:
    """Number of examples (size of dim 0) of a tensor, tuple/list or dict of tensors."""
    if isinstance(data, Tensor):
        return int(data.shape[0])
    if isinstance(data, Mapping):
        lengths = {int(v.shape[0]) for v in data.values()}
    elif isinstance(data, (tuple, list)):
        lengths = {int(v.shape[0]) for v in data}
    else:
        raise TypeError(f"data must be a tensor, a tuple/list or a dict of tensors, got {type(data).__name__}")
    if len(lengths) != 1:
        raise UserError(f"all tensors of a dataset must have the same length along dim 0, got {sorted(lengths)}")
    return lengths.pop()


def index_data(data: DataLike, index: Int[Tensor, " k"] | slice) -> DataLike:
    """Select examples ``index`` (along dim 0) of every tensor of ``data``."""
    if isinstance(data, Tensor):
        return data[index]
    if isinstance(data, Mapping):
        return {k: v[index] for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return type(data)(v[index] for v in data)
    raise TypeError(f"data must be a tensor, a tuple/list or a dict of tensors, got {type(data).__name__}")


def data_fingerprint(data: DataLike | None) -> str | None:
    """:func:`~interp_toolkit.io.tensor_digest` of a tensor / tuple / dict of tensors (None: None)."""
    if data is None:
        return None
    if isinstance(data, (Tensor, Mapping)):
        return tensor_digest(data)
    return tensor_digest(list(data))


def model_fingerprint(model: nn.Module) -> str:
    """:func:`~interp_toolkit.io.tensor_digest` of a model's state dict."""
    return tensor_digest(model.state_dict())


def per_example_losses(loss_fn: LossFn, data: DataLike, batch_size: int = 1024) -> Observable:
    """An observable: the per-example losses of ``data`` (flattened), evaluated in batches.

    Args:
        loss_fn: ``loss_fn(model, batch) -> Float[Tensor, "batch ..."]`` per-example losses.
        data: Examples to evaluate.
        batch_size: Examples per forward pass.

    Returns:
        A callable ``model -> Float[Tensor, " n_values"]`` (``n_values`` = examples x
        trailing loss dims).
    """
    n = data_length(data)

    def observable(model: nn.Module) -> Tensor:
        parts = []
        for start in range(0, n, batch_size):
            batch = index_data(data, slice(start, min(n, start + batch_size)))
            parts.append(loss_fn(model, batch).reshape(-1))
        return torch.cat(parts)

    observable.__qualname__ = f"per_example_losses({getattr(loss_fn, '__qualname__', repr(loss_fn))})"
    return observable


