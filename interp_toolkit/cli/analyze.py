"""The ``analyze`` subcommand: ``interp-toolkit analyze RUN_DIR --analysis NAME [options]``.

``add_analyze_parser(subparsers)`` registers it on an ``argparse`` subparsers object and
sets ``func=run_analyze``; ``run_analyze(args)`` runs the analysis over the run's
checkpoints and writes ``RUN_DIR/analyses/<name>/<name>.csv`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from interp_toolkit.analyses.ablation import METHODS
from interp_toolkit.analyses.over_checkpoints import ANALYSES, over_checkpoints
from interp_toolkit.plotting import FORMATS

# option -> analyses it applies to
_OPTION_SCOPE = {
    "split": ("fingerprints", "gradients"),
    "method": ("ablation",),
    "reference": ("ablation",),
    "split_names": ("ablation",),
    "source": ("patching",),
    "target": ("patching",),
    "positions": ("patching", "ablation"),
    "metric": ("patching",),
    "chunk_size": ("gradients",),
    "components": ("ablation", "patching"),
}


def add_analyze_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``analyze`` on ``subparsers`` (from ``parser.add_subparsers()``)."""
    p = subparsers.add_parser(
        "analyze", help="run a circuit analysis over a run's checkpoints (CSV + PNG in the run dir)",
        description="Run fingerprints, ablation, patching or gradients over every checkpoint of a run "
                    "(results cached per checkpoint and config; reruns are cache hits).")
    p.add_argument("run_dir", help="run directory written by `interp-toolkit train`")
    p.add_argument("--analysis", required=True, choices=sorted(ANALYSES))
    p.add_argument("--epochs", type=int, nargs="+", help="checkpoint epochs (default: all)")
    p.add_argument("--last", action="store_true", help="only the last checkpoint")
    p.add_argument("--n", type=int, help="examples per split used by the analysis")
    p.add_argument("--split", help="fingerprints/gradients: split to measure on (default train)")
    p.add_argument("--method", choices=METHODS, help="ablation: zero, mean or resample (default mean)")
    p.add_argument("--reference", help="ablation: split giving mean/resampled activations (default train)")
    p.add_argument("--split-names", nargs="+", help="ablation: splits measured (default: all but reference)")
    p.add_argument("--components", nargs="+", help="ablation/patching: e.g. L0H1 attn0 mlp1 resid_pre0")
    p.add_argument("--source", help="patching: source split (default val)")
    p.add_argument("--target", help="patching: target split (default adv)")
    p.add_argument("--positions", choices=["each", "all"],
                   help="patching: each position separately or all at once (ablation: 'all' only)")
    p.add_argument("--metric", choices=["logit_diff", "loss", "accuracy"], help="patching metric")
    p.add_argument("--chunk-size", type=int, help="gradients: examples per vmap chunk (default 256)")
    p.add_argument("--out-dir", help="output directory (default RUN_DIR/analyses/<analysis>)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--format", choices=FORMATS, default="png", help="figure file format (default png)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_analyze)
    return p


def _config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for option, scope in _OPTION_SCOPE.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if args.analysis not in scope:
            flag = "--" + option.replace("_", "-")
            raise ValueError(f"{flag} applies to {', '.join(scope)} only, not to {args.analysis}")
        config[option] = value
    if "positions" in config:
        if args.analysis == "ablation" and config["positions"] != "all":
            raise ValueError("--positions each is for patching; ablation ablates all positions at once")
        config["positions"] = None if config["positions"] == "all" else "each"
    if args.n is not None:
        config["n"] = args.n
    return config


def run_analyze(args: argparse.Namespace) -> int:
    """Run the ``analyze`` subcommand; returns the exit status (2 on bad input)."""
    from interp_toolkit.runs.trainer import list_checkpoints

    try:
        config = _config(args)
        epochs = args.epochs
        if args.last:
            if epochs:
                raise ValueError("--last and --epochs are exclusive")
            found = list_checkpoints(args.run_dir)
            if not found:
                raise ValueError(f"{args.run_dir} has no checkpoints")
            epochs = [found[-1][0]]
        result = over_checkpoints(args.analysis, args.run_dir, epochs=epochs, config=config,
                                  out_dir=args.out_dir, plot=not args.no_plot, progress=not args.no_progress,
                                  figure_format=args.format)
    except ValueError as err:
        print(f"interp-toolkit analyze: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.analysis}: {len(result.computed)} checkpoint(s) computed, {len(result.cache_hits)} from cache")
    print(f"table: {result.csv_path}")
    if result.png_path is not None:
        print(f"plot:  {result.png_path}")
    return 0


__all__ = ["add_analyze_parser", "run_analyze"]
