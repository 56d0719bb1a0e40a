"""Self-contained LM testbed: a tiny GPTNeoX (Pythia's architecture) trained from scratch
on the induction/delimiter corpus, checkpointed on Pythia's log-spaced-then-linear schedule.

Pythia saves step 0, steps 1, 2, 4, ..., 512 and then every 1000 steps;
:func:`interp_toolkit.sources.pythia_schedule` (re-exported here) generalizes that to any length (powers of two below
``linear_every``, then multiples of ``linear_every``). Checkpoints are local Hugging Face
directories ``<out>/checkpoints/step<NNNNNN>/`` (``save_pretrained`` plus a
``checkpoint.json`` with the step and training loss), loadable with
:class:`interp_toolkit.sources.CheckpointRef` / ``TransformerBridge.boot_transformers``
exactly as Pythia's Hub revisions would be.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json, config_hash
from interp_toolkit.runs.layout import CHECKPOINTS

# pythia_schedule lives with the Hub's Pythia revisions in sources (below the studies, which
# sources must not import); re-exported here
from interp_toolkit.sources import CheckpointRef, hf_local_checkpoints, pythia_schedule
from interp_toolkit.tasks.induction_corpus import CorpusConfig, make_corpus

__all__ = ["TESTBED_JSON", "TestbedConfig", "gptneox_config", "induction_phases", "plot_testbed_bif", "pythia_schedule",
           "testbed_model", "testbed_training_steps", "train_testbed"]

#: A trained testbed's record (its config, hash and whether training completed), in its folder.
TESTBED_JSON = "testbed.json"


@dataclass
class TestbedConfig(Config):
    """Validated testbed settings (defaults: ~5 minutes of training on one busy CPU core).

    Attributes:
        corpus: Training corpus.
        n_layers, n_heads, d_model, d_mlp: GPTNeoX size (parallel residual, as in Pythia).
        rotary_pct: Fraction of head dims with rotary embeddings. Pythia uses 0.25; with
            d_head 16 that leaves 4 positional dims and induction heads formed far later
            here, so the testbed default is 1.0.
        total_steps: Optimizer steps.
        linear_every: Linear checkpoint spacing (log-spaced below it).
        batch_size: Sequences per step.
        lr, weight_decay, warmup_steps: AdamW with linear warm-up then cosine decay to 10%.
        seed: Initialization and batch-order seed.
    """

    __test__ = False  # not a pytest class

    corpus: CorpusConfig = field(default_factory=lambda: CorpusConfig(chunk_min=8, chunk_max=16))
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    d_mlp: int = 256
    total_steps: int = 1500
    linear_every: int = 100
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 50
    rotary_pct: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rotary_pct, (int, float)) or not 0.0 < self.rotary_pct <= 1.0:
            raise UserError(f"TestbedConfig.rotary_pct must be in (0, 1], got {self.rotary_pct!r}")
        if isinstance(self.corpus, Mapping):
            self.corpus = CorpusConfig.from_dict(self.corpus)
        if not isinstance(self.corpus, CorpusConfig):
            raise UserError(f"TestbedConfig.corpus must be a CorpusConfig, got {type(self.corpus).__name__}")
        for name, minimum in (("n_layers", 1), ("n_heads", 1), ("d_model", 2), ("d_mlp", 1), ("total_steps", 1),
                              ("linear_every", 1), ("batch_size", 1), ("warmup_steps", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UserError(f"TestbedConfig.{name} must be an integer >= {minimum}, got {value!r}")
        if self.d_model % self.n_heads:
            raise UserError(f"TestbedConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.batch_size > self.corpus.n_sequences:
            raise UserError(f"TestbedConfig.batch_size ({self.batch_size}) exceeds corpus.n_sequences "
                            f"({self.corpus.n_sequences})")
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or value < 0 or (name == "lr" and value == 0)):
                raise UserError(f"TestbedConfig.{name} must be a finite number {'> 0' if name == 'lr' else '>= 0'}, "
                                f"got {value!r}")

    @property
    def checkpoint_steps(self) -> list[int]:
        return pythia_schedule(self.total_steps, self.linear_every)


def gptneox_config(config: TestbedConfig) -> Any:
    """The ``transformers.GPTNeoXConfig`` of the testbed model."""
    from transformers import GPTNeoXConfig

    # rotary_pct: transformers 5 maps this older name onto rope_parameters at run time (its
    # typed signature lacks it), and older versions read it directly
    return GPTNeoXConfig(  # type: ignore[call-arg]
        vocab_size=config.corpus.vocab_size, hidden_size=config.d_model, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads, intermediate_size=config.d_mlp,
        max_position_embeddings=config.corpus.seq_len, rotary_pct=config.rotary_pct, use_parallel_residual=True,
        hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )


def testbed_model(config: TestbedConfig, attn_implementation: str | None = None) -> Any:
    """The testbed's freshly initialized ``GPTNeoXForCausalLM`` (seeded by ``config.seed``).

    Args:
        config: Testbed settings.
        attn_implementation: e.g. ``"eager"`` to get attention weights back (default: the
            library's choice; the weights are the same either way).
    """
    from transformers import GPTNeoXForCausalLM

    hf_config = gptneox_config(config)
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    torch.manual_seed(config.seed)
    return GPTNeoXForCausalLM(hf_config)


def testbed_training_steps(config: TestbedConfig, model: Any) -> Iterator[tuple[int, float]]:
    """Train ``model`` in place with the testbed's optimizer, schedule and batches.

    AdamW (betas 0.9, 0.95) with linear warm-up then cosine decay to 10% of ``config.lr``,
    gradients clipped to norm 1, batches of ``config.batch_size`` corpus sequences drawn
    with replacement from a generator seeded ``config.seed + 1``, next-token cross-entropy.

    Yields:
        ``(step, loss)`` before each update and once after the last: ``step`` is the number
        of updates done so far (0 .. ``config.total_steps``), ``loss`` the training loss of
        the latest update (NaN at step 0). The caller may evaluate or save the model
        there; the model is put back in training mode before the next update.
    """
    tokens = make_corpus(config.corpus).tokens
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        frac = (step - config.warmup_steps) / max(1, config.total_steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(config.seed + 1)
    last_loss = float("nan")
    for step in range(config.total_steps + 1):
        yield step, last_loss
        if step == config.total_steps:
            break
        model.train()
        batch = tokens[torch.randint(0, tokens.shape[0], (config.batch_size,), generator=gen)]
        logits = model(batch).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        last_loss = float(loss.detach())


def train_testbed(config: TestbedConfig, out_dir: str | Path, progress: bool = True) -> list[CheckpointRef]:
    """Train the testbed model, saving HF checkpoints on the Pythia-style schedule.

    A finished run with the same config (``testbed.json`` holds its hash) is a cache hit:
    nothing is retrained. An unfinished one is retrained from scratch (deterministic).

    Args:
        config: Testbed settings.
        out_dir: Run directory (``testbed.json``, ``train_log.json``, ``checkpoints/``).
        progress: Show a tqdm bar.

    Returns:
        Refs of the saved checkpoints, by step.
    """
    if not isinstance(config, TestbedConfig):
        raise UserError(f"config must be a TestbedConfig, got {type(config).__name__}")
    out = Path(out_dir)
    key = config_hash(config.to_dict())
    record = out / TESTBED_JSON
    if record.exists():
        meta = json.loads(record.read_text())
        if meta.get("config_hash") == key and meta.get("complete"):
            return hf_local_checkpoints(out / CHECKPOINTS)
    model = testbed_model(config)
    save_at = set(config.checkpoint_steps)
    atomic_write_json(record, {"config": config.to_dict(), "config_hash": key, "complete": False})
    log: list[dict[str, float]] = []

    bar = tqdm(total=config.total_steps, desc="testbed", disable=not progress, leave=False)
    for step, last_loss in testbed_training_steps(config, model):
        if step > 0:
            log.append({"step": step, "loss": last_loss})
            bar.update(1)
        if step in save_at:
            model.eval()
            directory = out / CHECKPOINTS / f"step{step:06d}"
            model.save_pretrained(directory)
            atomic_write_json(
                directory / "checkpoint.json", {"step": step, "train_loss": last_loss, "config_hash": key}
            )
    bar.close()
    atomic_write_json(out / "train_log.json", log)
    atomic_write_json(record, {"config": config.to_dict(), "config_hash": key, "complete": True})
    return hf_local_checkpoints(out / CHECKPOINTS)


def induction_phases(steps: Sequence[int], scores: Sequence[float], low: float = 0.1,
                     high: float = 0.9) -> dict[str, Any]:
    """Formation step and before/during/after boundaries of the induction transition.

    The formation step is the checkpoint interval with the largest slope of the induction
    score (``delta score / delta step``), reported at its end. "During" runs from the first
    checkpoint whose score has covered ``low`` of the total rise (from the first score to
    the maximum) to the first that has covered ``high`` of it.

    Args:
        steps: Checkpoint steps (increasing).
        scores: Induction score at each step.
        low, high: Fractions of the rise that open and close "during".

    Returns:
        ``{"formation_step", "max_slope", "start", "end", "rise"}`` (``start``/``end`` are
        ``None`` when the score never rises).
    """
    if len(steps) != len(scores) or len(steps) < 2:
        raise UserError(f"need >= 2 (step, score) pairs, got {len(steps)} steps and {len(scores)} scores")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise UserError(f"steps must be strictly increasing, got {list(steps)}")
    slopes = [(scores[i + 1] - scores[i]) / (steps[i + 1] - steps[i]) for i in range(len(steps) - 1)]
    best = max(range(len(slopes)), key=lambda i: slopes[i])
    rise = max(scores) - scores[0]
    start = end = None
    if rise > 0:
        start = next(s for s, v in zip(steps, scores) if v - scores[0] >= low * rise)
        end = next(s for s, v in zip(steps, scores) if v - scores[0] >= high * rise)
    return {"formation_step": steps[best + 1], "max_slope": slopes[best], "start": start, "end": end, "rise": rise}


def plot_testbed_bif(
    rows: Sequence[Mapping[str, Any]],
    ax: Any = None,
    *,
    reduction: str = "class:all",
    query_group: str = "all",
    classes: Sequence[str] | None = None,
    xscale: str = "linear",
    min_rise: float = 0.2,
) -> Any:
    """Per-class token BIF over checkpoints with the induction transition marked.

    The BIF of each training-token class on the ``query_group`` loss (``reduction`` rows
    of ``bif-lm``'s ``per_class.csv``), +-1 stderr bands, over training steps; the
    induction score on one labelled twin axis; shaded, labelled before / during / after
    bands (:func:`induction_phases`) and a line at the formation step (max slope), only
    where a transition is measured: the score rises by at least ``min_rise``. A flatter
    score gets no bands, and the figure says so. Toolkit style, legend right of the data.

    Args:
        rows: ``per_class.csv`` rows (dicts; values may be strings).
        ax: Matplotlib axes to draw on (default: a new figure).
        reduction, query_group: Which BIF entries.
        classes: Training classes to draw (default: all in the table but ``bos``).
        xscale: ``"linear"`` or ``"symlog"`` (for log-spaced early checkpoints).
        min_rise: Smallest rise of the induction score (max minus first) shaded as a
            transition.

    Returns:
        The matplotlib ``Figure``.
    """
    from interp_toolkit.plotting import COMPONENT_PALETTE, new_figure, style

    sel = [r for r in rows if r["reduction"] == reduction and r["query_group"] == query_group]
    if not sel:
        raise UserError(f"no rows with reduction {reduction!r} and query group {query_group!r}")
    score = {int(r["step"]): float(r["induction_score"]) for r in sel}
    steps = sorted(score)
    phases = induction_phases(steps, [score[s] for s in steps])
    measured = phases["start"] is not None and phases["rise"] >= min_rise
    names = classes or [c for c in dict.fromkeys(r["train_group"] for r in sel) if c != "bos"]
    with style():
        fig, ax = new_figure(ax, figsize=(9.5, 4.8))
        for index, name in enumerate(names):
            pts = sorted((int(r["step"]), float(r["bif"]), float(r["stderr"])) for r in sel if r["train_group"] == name)
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            es = [0.0 if math.isnan(p[2]) else p[2] for p in pts]
            color = COMPONENT_PALETTE[index % len(COMPONENT_PALETTE)]  # black is the induction score
            ax.plot(xs, ys, marker="o", ms=2.5, lw=1.2, color=color, label=f"train {name} tokens")
            ax.fill_between(xs, [y - e for y, e in zip(ys, es)], [y + e for y, e in zip(ys, es)], color=color,
                            alpha=0.18, lw=0)
        ax.axhline(0, color="k", lw=0.5)
        if xscale == "symlog":
            ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(0, steps[-1])
        ax.set_xlabel("training step" + (" (symlog)" if xscale == "symlog" else ""))
        ax.set_ylabel(f"BIF on mean {query_group} query loss (-Cov)")
        if measured:
            spans = [("before", 0, phases["start"], "#dddddd"), ("during", phases["start"], phases["end"], "#ffe2b3"),
                     ("after", phases["end"], steps[-1], "#d6ecd2")]
            for label, lo, hi, color in spans:
                if hi > lo:
                    ax.axvspan(lo, hi, color=color, alpha=0.5, lw=0, zorder=0)
                    middle = math.sqrt(max(lo, 1) * hi) if xscale == "symlog" and lo > 0 else (lo + hi) / 2
                    ax.text(middle, 0.98, label, transform=ax.get_xaxis_transform(), ha="center", va="top")
            ax.axvline(phases["formation_step"], color="k", ls=":", lw=1.2,
                       label=f"formation (max slope), step {phases['formation_step']}")
        twin = ax.twinx()
        twin.plot(steps, [score[s] for s in steps], color="k", ls="--", lw=1.5, label="induction score")
        twin.set_ylim(0, 1)
        twin.set_ylabel("induction score\n(max-head prefix-matching attention)")
        twin.grid(False)
        lines, labels = ax.get_legend_handles_labels()
        lines2, labels2 = twin.get_legend_handles_labels()
        # beside the data, clear of the twin axis's label (further right than legend_outside)
        ax.legend(lines + lines2, labels + labels2, loc="upper left", bbox_to_anchor=(1.12, 1.0),
                  borderaxespad=0.0, fontsize="small")
        title = "Token-class BIF across the induction transition (tiny GPTNeoX testbed)"
        if not measured:  # said above the data, where no line runs
            title += (f"\nno induction transition measured: the score rose by {phases['rise']:.2f} "
                      f"(< {min_rise:g}), so no phases are shaded")
        ax.set_title(title)
    return fig
