"""The ``interp-toolkit`` command line.

Subcommands:
  train   train one MPSP model with checkpoints (flags or a JSON/YAML config file)
  info    print a checkpoint's (or run directory's) config, metadata and accuracies
  demo    the embedded default job: a small MPSP run with curves and a summary
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

DEMO_OUT = "runs/demo"


def _load_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"error: config file {path} does not exist")
    text = file.read_text()
    if file.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # pragma: no cover - pyyaml ships with transformers
            raise SystemExit("error: reading YAML configs needs pyyaml (pip install pyyaml)") from err
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise SystemExit(f"error: config file {path} must hold a mapping with keys task/model/train")
    unknown = sorted(set(data) - {"task", "model", "train", "run_dir"})
    if unknown:
        raise SystemExit(f"error: config file {path} has unknown sections {unknown}; "
                         "expected task, model, train, run_dir")
    return data


def _add_train_options(p: argparse.ArgumentParser) -> None:
    from interp_toolkit.tasks.mpsp import TASKS

    p.add_argument("--config", help="JSON or YAML file with sections task, model, train, run_dir; "
                   "flags given on the command line override it")
    g = p.add_argument_group("task (MPSP)")
    g.add_argument("--task", choices=sorted(TASKS), help="task variant (default max_parity_sum_parity)")
    g.add_argument("--r", type=float, help="spurious ratio of the training split, in [0, 1] (default 0.9)")
    g.add_argument("--seq-len", type=int, help="values per sequence (default 10)")
    g.add_argument("--n-values", type=int, help="values are 0..n_values-1 (default 10)")
    g.add_argument("--n-train", type=int, help="training examples (default 16384)")
    g.add_argument("--n-eval", type=int, help="examples in val and adv (default 2048)")
    g.add_argument("--data-seed", type=int, help="data seed (default 0)")
    g = p.add_argument_group("model")
    g.add_argument("--n-layers", type=int, help="transformer blocks (default 1)")
    g.add_argument("--n-heads", type=int, help="heads per block (default 2)")
    g.add_argument("--d-model", type=int, help="residual width (default 64)")
    g.add_argument("--d-mlp", type=int, help="MLP width (default 128)")
    g.add_argument("--attn-only", action="store_true", default=None, help="no MLPs")
    g.add_argument("--no-layernorm", action="store_true", default=None, help="normalization=None")
    g.add_argument("--model-seed", type=int, help="initialization seed (default 0)")
    g = p.add_argument_group("training")
    g.add_argument("--epochs", type=int, help="epochs (default 2000)")
    g.add_argument("--lr", type=float, help="AdamW learning rate (default 1e-3)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.1)")
    g.add_argument("--batch-size", type=int, help="minibatch size (default: full batch)")
    g.add_argument("--eval-every", type=int, help="evaluate every k epochs (default 10)")
    g.add_argument("--checkpoint-every", type=int, help="checkpoint every k epochs (default 100)")
    g.add_argument("--no-log-checkpoints", action="store_true", default=None,
                   help="no log-spaced checkpoints at epochs 1, 2, 4, ...")
    g.add_argument("--run-dir", help="run directory (default runs/<task>_<L>L<H>H_r<r>_<key>)")
    g.add_argument("--device", help="torch device (default cpu)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    from interp_toolkit.loggers import add_logger_flags

    add_logger_flags(g)


def _resolve_train_args(args: argparse.Namespace) -> tuple[Any, Any, Any, Path]:
    from interp_toolkit.io import config_hash
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    data = _load_config_file(args.config) if args.config else {}
    task = dict(data.get("task", {}))
    model = dict(data.get("model", {}))
    train = dict(data.get("train", {}))
    name = task.pop("task", None)
    if args.task:
        name = args.task
    for flag, key in (("r", "r"), ("seq_len", "seq_len"), ("n_values", "n_values"), ("n_train", "n_train"),
                      ("n_eval", "n_eval"), ("data_seed", "seed")):
        if getattr(args, flag) is not None:
            task[key] = getattr(args, flag)
    task_cfg = MPSPConfig.from_task(name or "max_parity_sum_parity", **task)
    model.setdefault("n_layers", 1)
    model.setdefault("n_heads", 2)
    for flag, key in (("n_layers", "n_layers"), ("n_heads", "n_heads"), ("d_model", "d_model"),
                      ("d_mlp", "d_mlp"), ("model_seed", "seed"), ("attn_only", "attn_only")):
        if getattr(args, flag) is not None:
            model[key] = getattr(args, flag)
    if args.no_layernorm:
        model["normalization"] = None
    model.update(task_cfg.model_dims())
    model_cfg = ModelConfig.from_dict(model)
    for flag, key in (("epochs", "epochs"), ("lr", "lr"), ("weight_decay", "weight_decay"),
                      ("batch_size", "batch_size"), ("eval_every", "eval_every"),
                      ("checkpoint_every", "checkpoint_every")):
        if getattr(args, flag) is not None:
            train[key] = getattr(args, flag)
    if args.no_log_checkpoints:
        train["checkpoint_log_spaced"] = False
    if args.quiet:
        train["progress"] = False
    train_cfg = TrainConfig.from_dict(train)
    run_dir = args.run_dir or data.get("run_dir")
    if not run_dir:
        key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), "train": train_cfg.to_dict()}, 8)
        run_dir = (f"runs/{task_cfg.name}_{model_cfg.n_layers}L{model_cfg.n_heads}H_r{task_cfg.r:g}"
                   f"_s{model_cfg.seed}_{key}")
    return task_cfg, model_cfg, train_cfg, Path(run_dir)


def train_mpsp(task_cfg: Any, model_cfg: Any, train_cfg: Any, run_dir: Path, device: str | None = None,
               callbacks: Any = None) -> Any:
    """Build the splits and model for an MPSP run and train it (resuming if possible)."""
    from interp_toolkit.model import build_model
    from interp_toolkit.runs.trainer import train
    from interp_toolkit.tasks.mpsp import make_splits

    splits = make_splits(task_cfg)
    model = build_model(model_cfg, device=device)
    return train(model, splits, train_cfg, run_dir, run_info={"task": {"name": task_cfg.name, **task_cfg.to_dict()}},
                 callbacks=callbacks)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        task_cfg, model_cfg, train_cfg, run_dir = _resolve_train_args(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from interp_toolkit.loggers import loggers_from_flags

    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir, device=args.device,
                        callbacks=loggers_from_flags(args))
    status = "already finished (nothing retrained)" if result.already_finished else (
        f"resumed from epoch {result.resumed_from}" if result.resumed_from is not None else "trained")
    print(f"{run_dir}: {status}")
    print(_format_metrics(result.final))
    return 0


def _format_metrics(metrics: dict[str, Any]) -> str:
    parts = [f"epoch {metrics.get('epoch', '?')}"]
    for key in sorted(metrics):
        if key.endswith("_acc"):
            parts.append(f"{key} {metrics[key]:.4f}")
    for key in sorted(metrics):
        if key.endswith("_loss"):
            parts.append(f"{key} {metrics[key]:.4g}")
    return "  ".join(parts)


def cmd_info(args: argparse.Namespace) -> int:
    from interp_toolkit.checkpoint import CheckpointError, read_checkpoint
    from interp_toolkit.runs.trainer import list_checkpoints

    target = Path(args.checkpoint)
    if target.is_dir():
        record_path = target / "run.json"
        if not record_path.exists():
            print(f"error: {target} is a directory without run.json (not a run directory)", file=sys.stderr)
            return 2
        record = json.loads(record_path.read_text())
        print(f"run {target}  status {record.get('status')}  key {record.get('key')}")
        print("task:  " + json.dumps(record.get("run_info", {}).get("task", {}), sort_keys=True))
        print("model: " + json.dumps(record.get("model_config"), sort_keys=True))
        print("train: " + json.dumps(record.get("train_config"), sort_keys=True))
        print("versions: " + json.dumps(record.get("versions"), sort_keys=True))
        checkpoints = list_checkpoints(target)
        print(f"checkpoints: {len(checkpoints)} (epochs {[e for e, _ in checkpoints]})")
        if record.get("final"):
            print("final: " + _format_metrics(record["final"]))
        return 0
    try:
        cfg, tensors, metadata = read_checkpoint(target)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    n_params = sum(t.numel() for t in tensors.values())
    print(f"checkpoint {target}")
    print(f"model: {json.dumps(cfg.to_dict(), sort_keys=True)}")
    print(f"parameters: {n_params:,} in {len(tensors)} tensors")
    metrics = metadata.get("metrics")
    other = {k: v for k, v in metadata.items() if k != "metrics"}
    print(f"metadata: {json.dumps(other, sort_keys=True)}")
    if metrics:
        print("accuracies: " + _format_metrics(metrics))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Small MPSP run on the embedded defaults, then a summary beside its curves."""
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task_cfg = MPSPConfig(r=0.9, n_train=args.n_train, n_eval=1024)
    model_cfg = ModelConfig(n_layers=1, n_heads=2, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=args.epochs, eval_every=10, checkpoint_every=50)
    run_dir = Path(args.out)
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir)
    metrics = result.metrics
    first = lambda key, thr: next((m["epoch"] for m in metrics if m[key] >= thr), None)  # noqa: E731
    summary = {
        "run_dir": str(run_dir),
        "task": task_cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "final": result.final,
        "epoch_val_acc_0.99": first("val_acc", 0.99),
        "epoch_adv_acc_1.0": first("adv_acc", 1.0),
        "max_adv_acc": max(m["adv_acc"] for m in metrics),
        "curves_png": str(run_dir / "curves.png"),
    }
    atomic_write_json(run_dir / "summary.json", summary)
    print(f"demo run: {run_dir}  ({'cached' if result.already_finished else 'trained'})")
    print("final: " + _format_metrics(result.final))
    print(f"shortcut (val >= 99%) first at epoch {summary['epoch_val_acc_0.99']}; "
          f"adversarial 100% first at epoch {summary['epoch_adv_acc_1.0']}; max adv {summary['max_adv_acc']:.3f}")
    print(f"curves: {summary['curves_png']}  summary: {run_dir / 'summary.json'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interp-toolkit",
        description="Mechanistic-interpretability studies on TransformerLens 4: train MPSP models "
        "with checkpoints, inspect checkpoints, run analyses.",
    )
    from interp_toolkit import __version__

    parser.add_argument("--version", action="version", version=f"interp-toolkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("train", help="train one MPSP model with checkpoints",
                       description="Train one MPSP model. Reruns of a finished run recompute nothing; "
                       "an interrupted run resumes from its last saved epoch.")
    _add_train_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("info", help="print a checkpoint's config, metadata and accuracies",
                       description="Print the model config, metadata and logged accuracies of a "
                       "checkpoint file, or the record of a run directory.")
    p.add_argument("checkpoint", help="a .safetensors checkpoint or a run directory")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="train a small MPSP model and write its curves and a summary")
    p.add_argument("--out", default=DEMO_OUT, help=f"run directory (default {DEMO_OUT})")
    p.add_argument("--epochs", type=int, default=300, help="epochs (default 300)")
    p.add_argument("--n-train", type=int, default=4096, help="training examples (default 4096)")
    p.set_defaults(func=cmd_demo)

    from interp_toolkit.cli.analyze import add_analyze_parser
    from interp_toolkit.cli.bif import add_bif_parser
    from interp_toolkit.cli.bif_lm import add_lm_bif_parser
    from interp_toolkit.studies.sweep import add_sweep_parsers

    add_sweep_parsers(sub)
    add_analyze_parser(sub)
    add_bif_parser(sub)
    add_lm_bif_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
