"""Token-level BIF over a series of LM checkpoints: tables, plots and the ``bif-lm`` command.

``interp-toolkit bif-lm CHECKPOINTS... --out DIR`` (register with
:func:`add_lm_bif_parser`; ``bif`` is the MPSP single-checkpoint command of
:mod:`interp_toolkit.cli.bif`). ``CHECKPOINTS`` are specs understood by
:func:`interp_toolkit.sources.resolve_checkpoints`: a toolkit run directory, a folder of
local HF checkpoint directories (e.g. the testbed's ``checkpoints/``), single
checkpoints, or ``hub:EleutherAI/pythia-14m@step1000,step2000``.

Data: the induction/delimiter corpus (:mod:`interp_toolkit.tasks.induction_corpus`); its
config is read from a testbed ``testbed.json`` found at or above the first checkpoint, or
from ``--corpus-config``. The posterior is the first ``--n-posterior`` training sequences;
the recorded training tokens are the first ``--n-train`` of those; the query tokens are
``--n-query`` held-out sequences (same generator, another seed).

Writes under ``--out``: one cached ``lm_bif_<hash>/`` per checkpoint, ``per_class.csv``
(step, checkpoint, induction score, train class, query group, BIF, stderr),
``per_class.png`` (BIF of each training-token class on the mean query loss over
checkpoints, with the induction score on a twin axis of the same time axis) and
``summary.json``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.lm import LMBIFConfig, TokenSet, lm_bif
from interp_toolkit.analyses.induction import induction_scores
from interp_toolkit.io import atomic_write_json, atomic_write_text
from interp_toolkit.plotting import FORMATS, save_figure
from interp_toolkit.sources import CheckpointRef, resolve_checkpoints
from interp_toolkit.tasks.induction_corpus import (
    CLASS_NAMES,
    CorpusConfig,
    make_corpus,
    repeated_random_tokens,
    target_classes,
)

__all__ = ["add_lm_bif_parser", "bif_over_checkpoints", "main", "plot_per_class", "run_lm_bif_command"]

CSV_FIELDS = ["step", "checkpoint", "induction_score", "reduction", "train_group", "query_group", "bif", "stderr"]


def corpus_sets(
    corpus: CorpusConfig, n_posterior: int, n_train: int, n_query: int, query_seed_offset: int = 10_007
) -> tuple[torch.Tensor, TokenSet, TokenSet]:
    """Posterior tokens, recorded training tokens and held-out query tokens with classes."""
    for name, value in (("n_posterior", n_posterior), ("n_train", n_train), ("n_query", n_query)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if n_train > n_posterior:
        raise ValueError(f"n_train ({n_train}) must be <= n_posterior ({n_posterior}): recorded tokens are training tokens")
    if n_posterior > corpus.n_sequences:
        raise ValueError(f"n_posterior ({n_posterior}) exceeds the corpus's {corpus.n_sequences} sequences")
    train_corpus = make_corpus(corpus)
    held_out = make_corpus(CorpusConfig.from_dict({**corpus.to_dict(), "n_sequences": n_query,
                                                   "seed": corpus.seed + query_seed_offset}))
    posterior = train_corpus.tokens[:n_posterior]
    train = TokenSet(posterior[:n_train], target_classes(train_corpus.classes[:n_train]), CLASS_NAMES)
    query = TokenSet(held_out.tokens, target_classes(held_out.classes), CLASS_NAMES)
    return posterior, train, query


def bif_over_checkpoints(
    refs: Sequence[CheckpointRef],
    corpus: CorpusConfig,
    config: LMBIFConfig,
    out_dir: str | Path,
    *,
    n_posterior: int = 512,
    n_train: int = 16,
    n_query: int = 16,
    induction_half_len: int | None = None,
    progress: bool = True,
    figure_format: str = "png",
) -> list[dict[str, Any]]:
    """Token-level BIF and induction score at every checkpoint; writes CSV, PNG and JSON.

    Args:
        refs: Checkpoints (the time axis is ``ref.step``; the list index if unknown).
        corpus: Corpus config of the training data.
        config: Sampler settings and reductions (``"class:all"`` is added if missing: it
            is what the plot shows).
        out_dir: Output and cache directory (a rerun reuses every cached checkpoint).
        n_posterior, n_train, n_query: Sequence counts (see :func:`corpus_sets`).
        induction_half_len: Length of the repeated half of the induction probe (default
            ``(seq_len - 1) // 2``).
        progress: tqdm bars.
        figure_format: ``png``, ``svg`` or ``pdf`` (``per_class.<format>``).

    Returns:
        The CSV rows (also in ``per_class.csv``).
    """
    from interp_toolkit.plotting import check_format

    figure_format = check_format(figure_format)
    if not refs:
        raise ValueError("no checkpoints given")
    if "class:all" not in config.reductions:
        config = LMBIFConfig.from_dict({**config.to_dict(), "reductions": [*config.reductions, "class:all"]})
    out = Path(out_dir)
    posterior, train, query = corpus_sets(corpus, n_posterior, n_train, n_query)
    half = induction_half_len or (corpus.seq_len - 1) // 2
    probe = repeated_random_tokens(32, half, corpus.first_ordinary, corpus.vocab_size, seed=corpus.seed + 77)
    rows: list[dict[str, Any]] = []
    summary = []
    for index, ref in enumerate(tqdm(refs, desc="checkpoints", disable=not progress)):
        model = ref.load()
        if getattr(model.cfg, "d_vocab", corpus.vocab_size) < corpus.vocab_size:
            raise ValueError(f"checkpoint {ref.label} has vocabulary {model.cfg.d_vocab} < corpus vocabulary {corpus.vocab_size}")
        heads = induction_scores(model, probe, half)
        score = float(heads.max())
        result = lm_bif(model, posterior, train, query, config, cache_dir=out, cache_identity=ref.identity())
        step = ref.step if ref.step is not None else index
        for name, red in result.reductions.items():
            if "token" in name:
                continue  # the full matrix stays in the cached safetensors, not in the table
            for i, row_label in enumerate(red.row_labels):
                for j, col_label in enumerate(red.col_labels):
                    rows.append({"step": step, "checkpoint": ref.label, "induction_score": score, "reduction": name,
                                 "train_group": row_label, "query_group": col_label,
                                 "bif": float(red.bif[i, j]), "stderr": float(red.stderr[i, j])})
        summary.append({"step": step, "checkpoint": ref.label, "induction_score": score,
                        "induction_scores_per_head": heads.tolist(), "result_dir": str(out / f"lm_bif_{result.cache_key}"),
                        "query_mean_loss": float(result.query_mean_loss.mean()),
                        "sampler_warnings": result.diagnostics.warnings if result.diagnostics else []})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "per_class.csv", buffer.getvalue())
    save_figure(plot_per_class(rows, pearson=config.sampler.pearson), out / f"per_class.{figure_format}")
    atomic_write_json(out / "summary.json", {"config": config.to_dict(), "corpus": corpus.to_dict(),
                                             "n_posterior": n_posterior, "n_train": n_train, "n_query": n_query,
                                             "checkpoints": summary})
    return rows


def plot_per_class(rows: Sequence[dict[str, Any]], ax: Any = None, pearson: bool = False) -> Any:
    """Per-class BIF on the mean query loss over checkpoints (+-stderr), induction score on
    a twin axis; x is the training step on a symlog axis (log-spaced early checkpoints,
    linear later ones).

    Args:
        rows: Rows of ``per_class.csv``.
        ax: Optional axes to draw into (the twin axis is added beside it).
        pearson: Label the y axis as a correlation.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import component_colors, new_figure, style

    sel = [r for r in rows if r["reduction"] == "class:all"]
    classes = [c for c in CLASS_NAMES if any(r["train_group"] == c for r in sel)] + sorted(
        {r["train_group"] for r in sel} - set(CLASS_NAMES))
    colors = component_colors(classes)
    with style():
        fig, ax = new_figure(ax, figsize=(8, 4.5))
        for cls in classes:
            pts = sorted((r["step"], r["bif"], r["stderr"]) for r in sel if r["train_group"] == cls)
            steps = [p[0] for p in pts]
            vals = [p[1] for p in pts]
            errs = [0.0 if math.isnan(p[2]) else p[2] for p in pts]
            ax.plot(steps, vals, marker="o", ms=3, label=f"train {cls} tokens", color=colors[cls])
            ax.fill_between(steps, [v - e for v, e in zip(vals, errs)], [v + e for v, e in zip(vals, errs)],
                            alpha=0.2, color=colors[cls])
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("training step (log scale)")
        ax.set_ylabel("-Corr" if pearson else "BIF = -Cov (class mean loss, query mean loss)")
        twin = ax.twinx()
        ind = sorted({(r["step"], r["induction_score"]) for r in sel})
        twin.plot([p[0] for p in ind], [p[1] for p in ind], color="k", ls="--", lw=1.5, label="induction score")
        twin.set_ylabel("induction score (max head)")
        twin.set_ylim(0, 1)
        twin.grid(False)
        lines, labels = ax.get_legend_handles_labels()
        lines2, labels2 = twin.get_legend_handles_labels()
        ax.legend(lines + lines2, labels + labels2, loc="best")
        ax.set_title("Token-level BIF per training-token class over checkpoints")
    return fig


def _find_corpus(refs: Sequence[CheckpointRef]) -> CorpusConfig | None:
    for ref in refs:
        if ref.kind == "hub":
            continue
        for folder in list(Path(ref.location).parents)[:3]:
            record = folder / "testbed.json"
            if record.is_file():
                return CorpusConfig.from_dict(json.loads(record.read_text())["config"]["corpus"])
    return None


def add_lm_bif_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bif-lm`` subcommand (default ``func``: :func:`run_lm_bif_command`)."""
    parser = subparsers.add_parser("bif-lm", help="token-level BIF of a language model across checkpoints",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="run dir, HF checkpoint folder(s), .safetensors, hub:NAME@REV,...")
    parser.add_argument("--corpus-config", type=Path, help="CorpusConfig as JSON (default: from testbed.json)")
    parser.add_argument("--out", type=Path, default=Path("runs/bif_lm"), help="output / cache directory")
    parser.add_argument("--n-posterior", type=int, default=512)
    parser.add_argument("--n-train", type=int, default=16, help="recorded training sequences")
    parser.add_argument("--n-query", type=int, default=16, help="recorded held-out query sequences")
    parser.add_argument("--reductions", nargs="+", default=["class:class", "class:all", "sequence:sequence"])
    defaults = SamplerConfig()
    parser.add_argument("--eps", type=float, default=1e-4)
    parser.add_argument("--gamma", type=float, default=defaults.gamma)
    parser.add_argument("--n-beta", type=float, default=None, help="default n / log n")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--burn-in", type=int, default=50)
    parser.add_argument("--steps-between-draws", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pearson", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--format", choices=FORMATS, default="png", help="figure file format (default png)")
    parser.set_defaults(func=run_lm_bif_command)
    return parser


def run_lm_bif_command(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run ``bif-lm``: validate everything, then compute; returns the CSV rows."""
    sampler = SamplerConfig(eps=args.eps, gamma=args.gamma, n_beta=args.n_beta, chains=args.chains, draws=args.draws,
                            burn_in=args.burn_in, steps_between_draws=args.steps_between_draws,
                            batch_size=args.batch_size, seed=args.seed, pearson=args.pearson,
                            progress=not args.no_progress)
    config = LMBIFConfig(sampler, reductions=tuple(args.reductions))
    refs = resolve_checkpoints(args.checkpoints)
    if args.corpus_config is not None:
        corpus = CorpusConfig.from_dict(json.loads(Path(args.corpus_config).read_text()))
    else:
        corpus = _find_corpus(refs)
        if corpus is None:
            raise ValueError("no corpus config: pass --corpus-config corpus.json (a CorpusConfig as JSON) "
                             "or checkpoints of a testbed run (with testbed.json)")
    rows = bif_over_checkpoints(refs, corpus, config, args.out, n_posterior=args.n_posterior, n_train=args.n_train,
                                n_query=args.n_query, progress=not args.no_progress, figure_format=args.format)
    print(f"wrote {args.out / 'per_class.csv'} and {args.out / ('per_class.' + args.format)} ({len(refs)} checkpoints)")
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Standalone entry point: ``python -m interp_toolkit.cli.bif_lm ...``."""
    import sys

    parser = argparse.ArgumentParser(prog="interp-toolkit")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_lm_bif_parser(subparsers)
    args = parser.parse_args(["bif-lm", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    main()
