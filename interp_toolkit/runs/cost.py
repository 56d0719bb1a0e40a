"""What a training step costs and how it is cut: FLOPs and activation bytes of one step
(:func:`step_flops`, :func:`bytes_per_member_example`), the torch thread policy of the
trainers (:func:`train_threads`, :func:`batched_train_threads`) and the passes the stacked
engine (:func:`interp_toolkit.runs.engine.stacked_grads`) splits a step into
(:func:`default_engine_chunk`, :func:`members_per_pass`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from interp_toolkit.devices import resolve_device

#: Member-positions (members x examples x positions) per forward/backward pass on CPU. A
#: step's gradient is accumulated over passes of this size: their activations stay near the
#: caches instead of growing with K x n. Scaled by the torch thread count (with more threads
#: every op must be larger to pay for the fork/join). Measured on an idle 2-core AMD EPYC
#: (32 MiB L3), n = 16,384, length 8 (9 positions), full batch, seconds per epoch
#: (``benchmarks/bench_engine.py --compare-positions``):
#:
#: ============  =========  =========  =========  =========  =========
#: positions     4,608      9,216      18,432     24,576     36,864
#: ============  =========  =========  =========  =========  =========
#: 2L, 1 thread  0.54       0.55       0.57       0.59-0.63  0.61-0.82
#: 1L, 1 thread  0.096      0.099      -          0.135      0.155
#: ============  =========  =========  =========  =========  =========
#:
#: and 2L on 2 threads 0.37 s (8,190 per thread), 0.43 (12,285), 0.53 (24,576), 2.3 (one
#: pass). Below ~1,000 positions the per-op overhead wins again. The pass size sets the
#: order in which a step's gradient is summed, so a change of it changes trained weights
#: at float32 rounding (~1e-7 relative per step), never the model or its loss.
CPU_MEMBER_POSITIONS_PER_PASS = 8_192


def default_engine_chunk(n_members: int, n_examples: int, device: str | torch.device = "cpu",
                         spec: Any = None, n_pos: int = 1) -> int:
    """Examples per pass of :func:`stacked_grads`.

    On a CPU, :data:`CPU_MEMBER_POSITIONS_PER_PASS` member-positions per pass and thread; on a GPU, the
    whole batch if every member's activations fit in 60% of the free memory, else as many
    examples as fit (so a GPU holds as many seeds as it can, each pass as large as fits).
    """
    device = torch.device(device)
    if device.type == "cpu":
        budget = CPU_MEMBER_POSITIONS_PER_PASS * torch.get_num_threads()
        return max(32, budget // (max(1, n_members) * max(1, n_pos)))
    if device.type != "cuda" or spec is None:
        return n_examples
    free, _ = torch.cuda.mem_get_info(device)
    per_example = bytes_per_member_example(spec, n_pos) * max(1, n_members)
    return max(1, min(n_examples, int(0.6 * free // per_example)))


def members_per_pass(n_members: int, chunk: int, n_pos: int, device: str | torch.device = "cpu") -> int:
    """Members whose gradients one pass of :func:`stacked_grads` computes together.

    On a CPU, a pass holds each member's full pass of ``chunk`` examples (the pass a single
    run makes) and as many members as fit in :data:`CPU_MEMBER_POSITIONS_PER_PASS`
    member-positions per thread, at least one. So K stacked members never make more passes,
    nor smaller matmuls per member, than K single runs: stacking merges the passes of runs
    whose batches are small, and is the single runs' own computation when they are large.
    On a GPU every member goes in each pass (:func:`default_engine_chunk` sizes the pass).
    """
    if torch.device(device).type != "cpu":
        return n_members
    budget = CPU_MEMBER_POSITIONS_PER_PASS * torch.get_num_threads()
    return max(1, min(n_members, budget // max(1, chunk * n_pos)))


def step_flops(model_cfg: Any, n_examples: int, n_pos: int, readout_only: bool = True) -> float:
    """Floating-point operations of one forward + backward pass (~3x the forward).

    Counts the matmuls and attention products of a dense implementation: with
    ``readout_only`` the last layer at the readout position only (what the loss needs,
    the engine's computation), else every layer at every position (the bridge's).
    """
    d, hd, mlp = model_cfg.d_model, model_cfg.n_heads * model_cfg.d_head, model_cfg.d_mlp
    mlp_flops = 0 if model_cfg.attn_only else 4 * d * mlp
    full_layer = n_pos * (2 * d * 3 * hd + 4 * n_pos * hd + 2 * hd * d + mlp_flops)
    if readout_only:
        last = n_pos * 2 * d * 2 * hd + 2 * d * hd + 4 * n_pos * hd + 2 * hd * d + mlp_flops
        unembed = 2 * d * model_cfg.d_vocab_out
    else:
        last = full_layer
        unembed = n_pos * 2 * d * model_cfg.d_vocab_out
    forward = (model_cfg.n_layers - 1) * full_layer + last + unembed
    return 3.0 * forward * n_examples


def bytes_per_member_example(model_cfg: Any, n_pos: int) -> int:
    """Rough bytes of activations autograd keeps per member and example (float32).

    ``model_cfg``: a ``ModelConfig`` or :class:`~interp_toolkit.runs.engine.EngineSpec` (both have the fields used).
    """
    d, hd, mlp = model_cfg.d_model, model_cfg.n_heads * model_cfg.d_head, model_cfg.d_mlp
    per_position = 4 * d + 3 * hd + 2 * hd + (0 if model_cfg.attn_only else 2 * mlp + 2 * d)
    return 4 * 2 * n_pos * per_position * model_cfg.n_layers  # x2: temporaries, gradients


def train_threads(model: Any, splits: Mapping[str, Any], cfg: Any, *args: Any, **kwargs: Any) -> int | None:
    """Thread policy of ``train``: 1 torch thread when one step is tiny, else unchanged."""
    from interp_toolkit.model import model_config_of
    from interp_toolkit.threads import threads_for

    tokens = splits[cfg.train_split].tokens
    device = cfg.device or next(model.parameters()).device
    return threads_for(step_flops(model_config_of(model), min(cfg.batch_size or len(tokens), len(tokens)),
                                  tokens.shape[1]), resolve_device(device))


def batched_train_threads(model_cfgs: Sequence[Any], splits: Mapping[str, Any], cfg: Any, *args: Any,
                          device: Any = None, **kwargs: Any) -> int | None:
    """Thread policy of ``train_batched``: 1 torch thread when one step of all members is tiny."""
    from interp_toolkit.threads import threads_for

    tokens = splits[cfg.train_split].tokens
    flops = step_flops(model_cfgs[0], min(cfg.batch_size or len(tokens), len(tokens)), tokens.shape[1])
    return threads_for(flops * len(model_cfgs), resolve_device(device or cfg.device or "cpu"))


__all__ = ["CPU_MEMBER_POSITIONS_PER_PASS", "batched_train_threads", "bytes_per_member_example",
           "default_engine_chunk", "members_per_pass", "step_flops", "train_threads"]
