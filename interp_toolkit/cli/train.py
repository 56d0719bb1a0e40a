"""``interp-toolkit train``: train one MPSP model with checkpoints.

Flags, or a JSON/YAML config file (``--config``) with sections ``task``, ``model``,
``train`` and ``run_dir``; flags given on the command line override the file. Reruns of a
finished run recompute nothing; an interrupted run resumes from its last saved epoch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from interp_toolkit.errors import UserError

HELP = "train one MPSP model with checkpoints"
DESCRIPTION = ("Train one MPSP model. Reruns of a finished run recompute nothing; an interrupted run "
               "resumes from its last saved epoch.")
# The names of interp_toolkit.tasks.mpsp.TASKS, spelled out so that --help needs no torch.
TASK_NAMES = ["first_mod3_sum_mod3", "first_parity_sum_parity", "max_mod3_sum_mod3", "max_parity_sum_parity"]


def load_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"config file {path} does not exist")
    text = file.read_text()
    if file.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:  # pragma: no cover - pyyaml ships with transformers
            raise UserError("reading YAML configs needs pyyaml (pip install pyyaml)") from err
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping with keys task/model/train")
    unknown = sorted(set(data) - {"task", "model", "train", "run_dir"})
    if unknown:
        raise UserError(f"config file {path} has unknown sections {unknown}; "
                         "expected task, model, train, run_dir")
    return data


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``train`` options (also used by scripts that wrap ``train``)."""
    p.add_argument("--config", help="JSON or YAML file with sections task, model, train, run_dir; "
                   "flags given on the command line override it")
    g = p.add_argument_group("task (MPSP)")
    g.add_argument("--task", choices=TASK_NAMES, help="task variant (default max_parity_sum_parity)")
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
    g.add_argument("--device", help="cpu, cuda, cuda:N or auto (default cpu)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def resolve_train_args(args: argparse.Namespace) -> tuple[Any, Any, Any, Path]:
    from interp_toolkit.io import config_hash
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.trainer import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    data = load_config_file(args.config) if args.config else {}
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


def train_mpsp(task_cfg: Any, model_cfg: Any, train_cfg: Any, run_dir: Path, device: str | None = None) -> Any:
    """Build the splits and model for an MPSP run and train it (resuming if possible)."""
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.model import build_model
    from interp_toolkit.runs.trainer import train
    from interp_toolkit.tasks.mpsp import make_splits

    resolved = resolve_device(device or "cpu")
    splits = make_splits(task_cfg)
    model = build_model(model_cfg, device=resolved)
    return train(model, splits, train_cfg, run_dir, run_info={"task": {"name": task_cfg.name, **task_cfg.to_dict()}})


def run(args: argparse.Namespace) -> int:
    """``interp-toolkit train``: returns 0; bad input raises a ``ValueError`` (exit 2 in ``main``)."""
    task_cfg, model_cfg, train_cfg, run_dir = resolve_train_args(args)
    result = train_mpsp(task_cfg, model_cfg, train_cfg, run_dir, device=args.device)
    status = "already finished (nothing retrained)" if result.already_finished else (
        f"resumed from epoch {result.resumed_from}" if result.resumed_from is not None else "trained")
    print(f"{run_dir}: {status}")
    print(format_metrics(result.final))
    return 0


def format_metrics(metrics: dict[str, Any]) -> str:
    parts = [f"epoch {metrics.get('epoch', '?')}"]
    for key in sorted(metrics):
        if key.endswith("_acc"):
            parts.append(f"{key} {metrics[key]:.4f}")
    for key in sorted(metrics):
        if key.endswith("_loss"):
            parts.append(f"{key} {metrics[key]:.4g}")
    return "  ".join(parts)


__all__ = ["DESCRIPTION", "HELP", "add_arguments", "format_metrics", "load_config_file", "resolve_train_args",
           "run", "train_mpsp"]
