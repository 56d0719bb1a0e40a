"""Command line: Bayesian influence of MPSP training examples on query losses at a checkpoint.

Register on the toolkit's CLI with :func:`add_bif_parser` (``interp-toolkit bif ...``), or
run standalone::

    python -m interp_toolkit.cli.bif CHECKPOINT --task-config task.json --out runs/bif

The task config is an ``MPSPConfig`` as JSON (``--task-config``); without it, the
``run.json`` beside the checkpoint's folder is searched for one (``info.task``,
``info.mpsp`` or ``info``). Writes a cached :class:`~interp_toolkit.analyses.bif.BIFResult`
(``bif_<hash>/bif.safetensors``, ``bif.json``, ``bif.png``) and ``summary.json`` with the
mean BIF of shortcut-consistent vs shortcut-inconsistent training examples on the query
loss (negative = helpful).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from interp_toolkit.analyses.bif import SamplerConfig, bif
from interp_toolkit.io import atomic_write_json

__all__ = ["add_bif_parser", "main", "readout_example_loss", "run_bif_command"]


def readout_example_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Per-example cross-entropy at the readout (last) position: a BIF ``loss_fn``."""
    tokens, labels = batch
    return F.cross_entropy(model(tokens)[:, -1, :], labels, reduction="none")


def add_bif_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``bif`` subcommand to an ``argparse`` subparsers object.

    The parser's default ``func`` is :func:`run_bif_command` (call ``args.func(args)``).
    """
    parser = subparsers.add_parser("bif", help="Bayesian influence functions at an MPSP checkpoint",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a .safetensors checkpoint (interp_toolkit format)")
    parser.add_argument("--task-config", type=Path, help="MPSPConfig as JSON (default: from run.json)")
    parser.add_argument("--out", type=Path, default=Path("runs/bif"), help="output / cache directory")
    parser.add_argument("--n-attribution", type=int, default=256, help="training examples scored (rows)")
    parser.add_argument("--n-query", type=int, default=64, help="query examples (columns)")
    parser.add_argument("--query-split", default="adv", choices=["train", "val", "adv"])
    defaults = SamplerConfig()
    parser.add_argument("--eps", type=float, default=defaults.eps)
    parser.add_argument("--gamma", type=float, default=defaults.gamma)
    parser.add_argument("--n-beta", type=float, default=None, help="default n / log n")
    parser.add_argument("--chains", type=int, default=defaults.chains)
    parser.add_argument("--draws", type=int, default=defaults.draws)
    parser.add_argument("--burn-in", type=int, default=defaults.burn_in)
    parser.add_argument("--steps-between-draws", type=int, default=defaults.steps_between_draws)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pearson", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--format", choices=("png", "svg", "pdf"), default="png",
                        help="figure file format (the cached result always has bif.png)")
    parser.set_defaults(func=run_bif_command)
    return parser


def _task_config(args: argparse.Namespace) -> Any:
    from interp_toolkit.tasks.mpsp import MPSPConfig

    if args.task_config is not None:
        return MPSPConfig.from_dict(json.loads(Path(args.task_config).read_text()))
    for folder in (args.checkpoint.parent, args.checkpoint.parent.parent):
        record_path = folder / "run.json"
        if record_path.exists():
            info = json.loads(record_path.read_text()).get("info", {})
            for candidate in (info.get("task"), info.get("mpsp"), info):
                if isinstance(candidate, dict):
                    try:
                        return MPSPConfig.from_dict(candidate)
                    except (TypeError, ValueError):
                        continue
    raise ValueError(
        f"no MPSP task config for {args.checkpoint}: pass --task-config task.json (an MPSPConfig as JSON)"
    )


def run_bif_command(args: argparse.Namespace) -> dict[str, Any]:
    """Run the ``bif`` subcommand; returns (and writes) the summary."""
    from interp_toolkit.checkpoint import load_checkpoint
    from interp_toolkit.tasks.mpsp import make_splits

    config = SamplerConfig(
        eps=args.eps, gamma=args.gamma, n_beta=args.n_beta, chains=args.chains, draws=args.draws,
        burn_in=args.burn_in, steps_between_draws=args.steps_between_draws, batch_size=args.batch_size,
        seed=args.seed, pearson=args.pearson, progress=not args.no_progress,
    )
    for name in ("n_attribution", "n_query"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    task = _task_config(args)
    splits = make_splits(task)
    model, metadata = load_checkpoint(args.checkpoint)
    train = splits["train"]
    if config.batch_size is not None and config.batch_size > train.labels.shape[0]:
        config = SamplerConfig.from_dict({**config.to_dict(), "batch_size": None})
    gen = torch.Generator().manual_seed(args.seed)
    rows = torch.randperm(train.labels.shape[0], generator=gen)[: args.n_attribution]
    query = splits[args.query_split]
    result = bif(
        model,
        (train.tokens, train.labels),
        (query.tokens[: args.n_query], query.labels[: args.n_query]),
        readout_example_loss,
        config,
        attribution_data=(train.tokens[rows], train.labels[rows]),
        cache_dir=args.out,
        cache_tag="mpsp-readout-ce",
    )
    per_row = result.bif.mean(1)
    agrees = train.agrees[rows]
    summary = {
        "checkpoint": str(args.checkpoint),
        "checkpoint_metadata": metadata,
        "task": task.to_dict(),
        "query_split": args.query_split,
        "cache_key": result.cache_key,
        "result_dir": str(Path(args.out) / f"bif_{result.cache_key}"),
        "mean_bif_on_query_loss": {
            "shortcut_consistent_train_examples": float(per_row[agrees].mean()) if agrees.any() else None,
            "shortcut_inconsistent_train_examples": float(per_row[~agrees].mean()) if (~agrees).any() else None,
        },
        "sampler_warnings": result.diagnostics.warnings if result.diagnostics else [],
    }
    atomic_write_json(Path(args.out) / f"bif_{result.cache_key}" / "summary.json", summary)
    figure_format = getattr(args, "format", "png")
    if figure_format != "png":  # bif() caches bif.png beside the result; add the asked format
        from interp_toolkit.analyses.bif import plot_bif
        from interp_toolkit.plotting import save_figure

        save_figure(plot_bif(result), Path(summary["result_dir"]) / "bif", figure_format)
    print(json.dumps(summary["mean_bif_on_query_loss"], indent=2))
    print(f"wrote {summary['result_dir']}")
    return summary


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Standalone entry point: ``python -m interp_toolkit.cli.bif ...``."""
    parser = argparse.ArgumentParser(prog="bif")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_bif_parser(subparsers)
    args = parser.parse_args(["bif", *(argv if argv is not None else sys.argv[1:])])
    return args.func(args)


if __name__ == "__main__":
    main()
