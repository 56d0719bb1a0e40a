"""``interp-toolkit sweep``: a grid of MPSP cells x seeds, resumable and cached per run.

The study itself lives in :mod:`interp_toolkit.studies.sweep`; this module only turns a
preset, a JSON/YAML file of ``SweepConfig`` fields and flags (later wins) into a
``SweepConfig`` and runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp_toolkit.errors import UserError

if TYPE_CHECKING:
    from interp_toolkit.studies.sweep import SweepConfig

HELP = "run a seed sweep of MPSP cells (resumable, cached per run)"


def __getattr__(name: str) -> Any:
    if name == "DESCRIPTION":  # built from the presets' notes, which live with the study code
        from interp_toolkit.studies.sweep import PRESET_NOTES

        return ("Run a grid of MPSP cells x seeds. Finished runs are reused, interrupted ones resume. "
                "Presets: " + "; ".join(f"{k}: {v}" for k, v in PRESET_NOTES.items()))
    raise AttributeError(name)


def parse_list(text: str, kind: type) -> list[Any]:
    try:
        return [kind(item) for item in text.split(",") if item.strip()]
    except ValueError as err:
        raise ValueError(f"could not parse {text!r} as a comma-separated list of {kind.__name__}") from err


def _load_sweep_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"sweep config file {path} does not exist")
    if file.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(file.read_text())
    else:
        data = json.loads(file.read_text())
    if not isinstance(data, dict):
        raise UserError(f"sweep config file {path} must hold a mapping of SweepConfig fields")
    return data


def sweep_config_from_args(args: Any) -> "SweepConfig":
    """Preset, then config file, then flags (later wins)."""
    from interp_toolkit.studies.sweep import PRESETS, SweepConfig

    data: dict[str, Any] = dict(PRESETS[args.preset]) if args.preset else {}
    if args.config:
        data.update(_load_sweep_file(args.config))
    lists = {"tasks": ("tasks", str), "ratios": ("ratios", float), "layers": ("n_layers", int),
             "heads": ("n_heads", int), "weight_decays": ("weight_decays", float)}
    for flag, (key, kind) in lists.items():
        if getattr(args, flag) is not None:
            data[key] = parse_list(getattr(args, flag), kind)
    if args.seeds is not None:
        data["seeds"] = parse_list(args.seeds, int) if "," in args.seeds else int(args.seeds)
    for flag in ("name", "epochs", "n_train", "n_eval", "seq_len", "n_values", "d_model", "d_mlp", "lr",
                 "eval_every", "checkpoint_every", "seeds_per_process", "data_seed", "batch_size"):
        if getattr(args, flag) is not None:
            data[flag] = getattr(args, flag)
    if args.early_stop is not None:
        data["early_stop"] = args.early_stop
    if getattr(args, "device", None) is not None and "device" in {f.name for f in dataclasses.fields(SweepConfig)}:
        data["device"] = args.device
    return SweepConfig.from_dict(data)


def run(args: Any) -> int:
    """``interp-toolkit sweep``: preset ``smoke`` unless ``--preset`` or ``--config`` is given."""
    from interp_toolkit.studies.sweep import run_sweep

    if args.preset is None and args.config is None:
        args.preset = "smoke"
    cfg = sweep_config_from_args(args)
    if args.device is not None:
        from interp_toolkit.devices import resolve_device

        resolve_device(args.device)  # a bad or unavailable device fails before any work
    if args.dry_run:
        print(json.dumps(cfg.to_dict(), indent=2))
        print(f"{len(cfg.cells())} cells x {len(cfg.seeds)} seeds = {cfg.n_runs()} runs")
        return 0
    result = run_sweep(cfg, args.out, backend=args.backend, workers=args.workers, address=args.address,
                       progress=not args.quiet, report=False)
    print(f"study {result.study_dir}: {len(result.rows)} runs ({result.n_cached} cached) in {result.seconds:.0f} s")
    from interp_toolkit.studies.report import write_report

    write_report(result.study_dir, print_table=True)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``sweep`` options."""
    from interp_toolkit.studies.sweep import BACKENDS, PRESETS

    p.add_argument("--preset", choices=sorted(PRESETS), help="start from a preset (default: smoke "
                   "unless --config is given)")
    p.add_argument("--config", help="JSON or YAML file of SweepConfig fields (overrides the preset)")
    p.add_argument("--out", help="study directory (default runs/sweeps/<name>_<hash>)")
    p.add_argument("--backend", choices=BACKENDS, default="local", help="local process pool or Ray")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--workers", type=int, help="local processes (default: CPU count)")
    p.add_argument("--name")
    p.add_argument("--tasks", help="comma-separated MPSP task names")
    p.add_argument("--ratios", help="comma-separated spurious ratios, e.g. 0.1,0.5,0.9")
    p.add_argument("--layers", help="comma-separated layer counts, e.g. 1,2")
    p.add_argument("--heads", help="comma-separated head counts, e.g. 1,2")
    p.add_argument("--weight-decays", dest="weight_decays", help="comma-separated weight decays")
    p.add_argument("--seeds", help="a count n (seeds 0..n-1) or a comma-separated list")
    p.add_argument("--seeds-per-process", dest="seeds_per_process", type=int,
                   help="at most this many seeds trained together per job")
    for flag, kind in (("epochs", int), ("n-train", int), ("n-eval", int), ("seq-len", int), ("n-values", int),
                       ("d-model", int), ("d-mlp", int), ("lr", float), ("eval-every", int),
                       ("checkpoint-every", int), ("data-seed", int), ("batch-size", int)):
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), type=kind)
    p.add_argument("--early-stop", dest="early_stop", action="store_true", default=None,
                   help="stop a run once it has generalized")
    p.add_argument("--no-early-stop", dest="early_stop", action="store_false")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (checked before any work)")


def main(argv: list[str] | None = None) -> int:
    """``python -m interp_toolkit.cli.sweep ...``: the same as ``interp-toolkit sweep ...``."""
    import sys

    from interp_toolkit.cli import main as cli_main

    return cli_main(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["HELP", "add_arguments", "main", "parse_list", "run", "sweep_config_from_args"]
