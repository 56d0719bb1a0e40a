"""Shared pieces of the analyses: result tables, metrics, model introspection, validation."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, overload

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.errors import UserError
from interp_toolkit.model import HookedModel
from interp_toolkit.table import Table


@dataclass
class AnalysisResult:
    """What every high-level analysis returns: a tidy table plus the raw tensors.

    Attributes:
        table: One row per measured quantity (see each analysis for its columns).
        tensors: Named raw tensors behind the table (shapes documented per analysis).
        config: The analysis settings that produced it (JSON-able).
    """

    table: Table
    tensors: dict[str, Tensor] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.table.rows

    def to_csv(self, path: str | Path) -> Path:
        return self.table.to_csv(path)

    def to_pandas(self) -> Any:
        """The result's table as a :class:`pandas.DataFrame` (see :meth:`Table.to_pandas`);
        the analysis config is attached as ``DataFrame.attrs["config"]``."""
        frame = self.table.to_pandas()
        frame.attrs["config"] = dict(self.config)
        return frame


# --------------------------------------------------------------------------- metrics

def logit_diff(logits: Float[Tensor, "batch classes"], labels: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """Correct-class logit minus the mean of the other classes' logits, per example."""
    correct = logits.gather(-1, labels[:, None]).squeeze(-1)
    n_classes = logits.shape[-1]
    others = (logits.sum(-1) - correct) / max(n_classes - 1, 1)
    return correct - others


METRICS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "loss": lambda logits, labels: F.cross_entropy(logits, labels, reduction="none"),
    "accuracy": lambda logits, labels: (logits.argmax(-1) == labels).float(),
    "logit_diff": logit_diff,
}


# --------------------------------------------------------------------------- model

def model_shape(model: HookedModel) -> dict[str, Any]:
    """``n_layers, n_heads, d_head, attn_only, n_ctx, d_vocab_out`` of a TransformerLens model."""
    cfg = model.cfg
    return {
        "n_layers": int(cfg.n_layers),
        "n_heads": int(cfg.n_heads),
        "d_head": int(cfg.d_head),
        "attn_only": bool(getattr(cfg, "attn_only", False)),
        "n_ctx": int(cfg.n_ctx),
        "d_vocab_out": int(getattr(cfg, "d_vocab_out", cfg.d_vocab)),
        "positional_embedding_type": getattr(cfg, "positional_embedding_type", "standard"),
    }


class _CallableModule(types.ModuleType):
    """An analysis module that is also its high-level function: ``ablation(model, splits)``
    works on ``interp_toolkit.analyses.ablation`` (the module) as on the function of that name
    in it, so importing the module by its function's name is never a trap."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def callable_module(name: str) -> None:
    """Make the module ``name`` (pass ``__name__``) callable as its function of the same name."""
    sys.modules[name].__class__ = _CallableModule


def model_device(model: HookedModel) -> torch.device:
    return next(model.parameters()).device


def check_split(name: str, split: Any, n_ctx: int | None = None, d_vocab: int | None = None) -> None:
    """ValueError unless ``split`` has ``tokens`` [n, pos] and ``labels`` [n] (and, with
    ``d_vocab``, token ids the model's embedding has)."""
    tokens = getattr(split, "tokens", None)
    labels = getattr(split, "labels", None)
    if not isinstance(tokens, Tensor) or not isinstance(labels, Tensor):
        raise UserError(f"split {name!r} must have .tokens and .labels tensors, got {type(split).__name__}")
    if tokens.ndim != 2 or labels.ndim != 1 or tokens.shape[0] != labels.shape[0] or tokens.shape[0] == 0:
        raise UserError(
            f"split {name!r}: expected tokens [n, pos] and labels [n] with the same n >= 1, got "
            f"{tuple(tokens.shape)} and {tuple(labels.shape)}"
        )
    for what, tensor in (("tokens", tokens), ("labels", labels)):
        # float ids would be cast silently (or fail deep in an embedding); meta tensors hold no data
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise UserError(f"split {name!r}: {what} have dtype {tensor.dtype}; expected integer ids (torch.long)")
        if tensor.device.type == "meta":
            raise UserError(f"split {name!r}: {what} are on the meta device (shapes without data); expected "
                             f"tensors holding the data, on the CPU or a GPU")
    if n_ctx is not None and tokens.shape[1] > n_ctx:
        raise UserError(f"split {name!r}: sequence length {tokens.shape[1]} exceeds the model's n_ctx {n_ctx}")
    if d_vocab is not None:
        from interp_toolkit.runs.trainer import check_token_ids

        check_token_ids(name, tokens, d_vocab)


def check_splits(splits: Mapping[str, Any], names: Iterable[str], model: HookedModel | None = None) -> None:
    """ValueError naming any requested split that is missing or malformed."""
    if not isinstance(splits, Mapping) or not splits:
        raise UserError(f"splits must be a non-empty mapping name -> split, got {type(splits).__name__}")
    n_ctx = model_shape(model)["n_ctx"] if model is not None else None
    d_vocab = int(model.cfg.d_vocab) if model is not None and hasattr(model, "cfg") else None
    n_out = getattr(getattr(model, "cfg", None), "d_vocab_out", None) if model is not None else None
    toolkit_model = getattr(model, "interp_config", None) is not None  # built from a ModelConfig for a task
    if model is not None:
        parameter = next(iter(model.parameters()), None)
        if parameter is not None and parameter.device.type == "meta":
            raise UserError("the model is on the meta device (parameters without values); load a checkpoint "
                             "(interp_toolkit.load_checkpoint) or build it on the CPU or a GPU")
    for name in names:
        if name not in splits:
            raise UserError(f"split {name!r} not found; available splits: {sorted(splits)}")
        check_split(name, splits[name], n_ctx, d_vocab)
        task = getattr(splits[name], "task", None)
        classes = getattr(task, "modulus", None)
        if toolkit_model and isinstance(n_out, int) and isinstance(classes, int) and n_out != classes:
            # a mod-3 model on parity splits runs without an error and measures nothing meaningful
            # (a Hugging Face model reads the classes off its whole vocabulary: not compared)
            raise UserError(f"split {name!r} is of a task with {classes} classes ({getattr(task, 'label', '?')}), "
                             f"but the model has {n_out} outputs (d_vocab_out); the data and the model are of "
                             f"different tasks")
        if isinstance(n_out, int):
            from interp_toolkit.runs.trainer import check_label_ids

            check_label_ids(name, splits[name].labels, n_out)


def check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise UserError(f"{name} must be one of {list(choices)}, got {value!r}")


@overload
def check_positions(positions: Sequence[int], seq_len: int) -> list[int]: ...
@overload
def check_positions(positions: None, seq_len: int) -> None: ...
def check_positions(positions: Sequence[int] | None, seq_len: int) -> list[int] | None:
    """Normalize positions to non-negative ints; ``None`` means every position."""
    if positions is None:
        return None
    out = []
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not -seq_len <= p < seq_len:
            raise UserError(f"position {p!r} is out of range for sequence length {seq_len}")
        out.append(p % seq_len)
    return out


def first_n(split: Any, n: int | None) -> tuple[Tensor, Tensor]:
    tokens, labels = split.tokens, split.labels
    if n is not None:
        tokens, labels = tokens[:n], labels[:n]
    return tokens, labels
