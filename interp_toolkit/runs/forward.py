"""The lean forward of one model over a bridge's own parameters: :class:`ReadoutForward` (the
training loss at the readout position, ``train()``'s forward) and :class:`SequenceForward`
(next-token logits at every position, the LM BIF's), each equal to the bridge's own
forward (``tests/runs/test_engine.py``, ``tests/runs/test_sequence_engine.py``, and against the
independent reference of :mod:`interp_toolkit.runs.reference`); the functional math is
:mod:`interp_toolkit.runs.engine`'s.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp_toolkit.runs.config import check_engine_name
from interp_toolkit.runs.cost import default_engine_chunk
from interp_toolkit.runs.engine import (
    EngineSpec,
    engine_spec,
    member_losses,
    readout_logits,
    sequence_logits,
    warn_fallback_once,
)


def model_engine_spec(model: Any) -> tuple[EngineSpec | None, str | None]:
    """The :class:`EngineSpec` of a toolkit bridge, or ``(None, reason)`` when the lean
    engine cannot run it (no toolkit ``ModelConfig``, or an inexpressible option)."""
    model_cfg = getattr(model, "interp_config", None)
    if model_cfg is None:
        return None, "the model has no interp_toolkit ModelConfig"
    return engine_spec(model_cfg, getattr(model, "cfg", None))


class ReadoutForward:
    """``tokens -> logits at the readout position`` of one bridge, fast or via the bridge.

    Built once per training run (cheap): it holds references to the bridge's own
    parameter tensors, so optimizer steps and ``load_state_dict`` are seen at once.

    Args:
        model: A toolkit model (``build_model`` / ``load_checkpoint``).
        position: Readout position.
        engine: ``"fast"`` (the lean engine where expressible, else the bridge with a
            warning) or ``"bridge"`` (always the bridge's full forward).
    """

    def __init__(self, model: Any, position: int = -1, engine: str = "fast") -> None:
        check_engine_name(engine)
        self.model = model
        self.position = position
        self.spec: EngineSpec | None = None
        self.reason: str | None = None
        if engine == "fast":
            self.spec, self.reason = model_engine_spec(model)
            if self.spec is None:
                warn_fallback_once(self.reason or "unknown")
            else:
                self.tensors = [(key, t) for key, t in model.state_dict(keep_vars=True).items()
                                if not key.endswith("causal_mask")]

    @property
    def fast(self) -> bool:
        """Whether the lean engine (not the bridge) computes the logits."""
        return self.spec is not None

    def params(self) -> dict[str, Tensor]:
        """The bridge's tensors by state-dict key, with a member dim of 1 (views)."""
        return {key: t.unsqueeze(0) for key, t in self.tensors}

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch vocab_out"]:
        if self.spec is None:
            return self.model(tokens)[:, self.position, :]
        return readout_logits(self.spec, self.params(), tokens, self.position)[0]

    def loss(self, tokens: Int[Tensor, "batch pos"], labels: Int[Tensor, " batch"]) -> Float[Tensor, ""]:
        """Mean cross-entropy at the readout (the training loss), by the same ops for any K."""
        if self.spec is None:
            return F.cross_entropy(self(tokens), labels)
        return member_losses(readout_logits(self.spec, self.params(), tokens, self.position), labels)[0]

    def backward(self, tokens: Int[Tensor, "batch pos"], labels: Int[Tensor, " batch"],
                 chunk_size: int | None = None) -> Float[Tensor, ""]:
        """Accumulate the gradient of the mean readout loss into ``.grad``; return the loss.

        The batch is processed in passes of ``chunk_size`` examples (default
        :func:`default_engine_chunk` for one member), as :func:`stacked_grads` does for K
        members: with equal passes the two give bit-identical gradients.
        """
        n = labels.shape[0]
        if self.spec is None:
            loss = F.cross_entropy(self(tokens), labels)
            loss.backward()
            return loss.detach()
        chunk = chunk_size or default_engine_chunk(1, n, tokens.device, self.spec, tokens.shape[1])
        params = self.params()
        total = None
        for start in range(0, n, chunk):
            logits = readout_logits(self.spec, params, tokens[start : start + chunk], self.position)
            part = member_losses(logits, labels[start : start + chunk], divisor=None if chunk >= n else n)[0]
            part.backward()
            total = part.detach() if total is None else total + part.detach()
        assert total is not None
        return total


class SequenceForward:
    """``tokens -> logits at every position`` of one bridge, fast or via the bridge.

    The language-model counterpart of :class:`ReadoutForward` (used by the BIF's
    next-token losses): it holds the bridge's own parameter objects, so optimizer and SGLD
    updates (also ones that swap a parameter's ``.data``) and ``load_state_dict`` are seen
    at once, and gradients reach the bridge's parameters.

    Args:
        model: A bridge. The lean engine needs the toolkit's ``ModelConfig``
            (``build_model`` / ``load_checkpoint``); other models (e.g. Hugging Face
            checkpoints) use the bridge's forward.
        engine: ``"fast"`` (the lean engine where expressible) or ``"bridge"``.
        warn: Warn once (:class:`EngineFallbackWarning`) when ``"fast"`` falls back.
    """

    def __init__(self, model: Any, engine: str = "fast", warn: bool = True) -> None:
        check_engine_name(engine)
        self.model = model
        self.spec: EngineSpec | None = None
        self.reason: str | None = "engine='bridge'"
        if engine == "fast":
            self.spec, self.reason = model_engine_spec(model)
            if self.spec is None and warn:
                warn_fallback_once(self.reason or "unknown")
        self.params: dict[str, Tensor] = {}
        if self.spec is not None:
            self.params = {key: t for key, t in model.state_dict(keep_vars=True).items()
                           if not key.endswith("causal_mask")}
        self.parameter_ids = _parameter_ids(model)

    @property
    def fast(self) -> bool:
        """Whether the lean engine (not the bridge) computes the logits."""
        return self.spec is not None

    def current(self) -> bool:
        """Whether the model still holds the parameter objects this forward reads (false
        after, e.g., ``load_state_dict(..., assign=True)``)."""
        return self.parameter_ids == _parameter_ids(self.model)

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab_out"]:
        if self.spec is None:
            return self.model(tokens)
        return sequence_logits(self.spec, self.params, tokens)


def _parameter_ids(model: Any) -> tuple[int, ...]:
    return tuple(id(p) for p in model.parameters())


_sequence_forwards: "weakref.WeakKeyDictionary[Any, SequenceForward]" = weakref.WeakKeyDictionary()


def sequence_forward(model: Any) -> SequenceForward:
    """The model's :class:`SequenceForward` (``engine="fast"``, no fallback warning), built
    once per model and rebuilt when the model's parameter objects change."""
    forward = _sequence_forwards.get(model)
    if forward is None or not forward.current():
        forward = SequenceForward(model, "fast", warn=False)
        forward.model = weakref.proxy(model)  # the cache must not keep the model alive
        _sequence_forwards[model] = forward
    return forward


__all__ = [
    "model_engine_spec", "ReadoutForward", "SequenceForward", "_parameter_ids", "_sequence_forwards",
    "sequence_forward",
]
