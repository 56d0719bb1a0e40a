"""Fake study directories for report tests: run.json as a sweep writes it, plus metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from interp_toolkit.io import atomic_write_json

GEN = [(0.5, 0.5), (1.0, 0.0), (1.0, 1.0)]  # generalized and rule learned at r > 1/2
STUCK = [(0.5, 0.5), (1.0, 0.0), (1.0, 0.02)]
TASK = {"name": "max_parity_sum_parity", "label": "sum_parity", "shortcut": "max", "seq_len": 5, "n_values": 10,
        "n_train": 4096, "n_eval": 512, "seed": 0}
MODEL = {"n_layers": 1, "n_heads": 2, "d_model": 64, "d_mlp": 128}
TRAIN = {"epochs": 300, "lr": 1e-3, "weight_decay": 0.1, "batch_size": None, "eval_every": 20}


def curve(pairs, every=10):
    """Evaluations every ``every`` epochs from (val_acc, adv_acc) pairs."""
    return [{"epoch": i * every, "val_acc": v, "adv_acc": a} for i, (v, a) in enumerate(pairs)]


def make_run(study: Path, name: str, r: float, seed: int, points, *, early_stop: bool = False,
             status: str = "finished", **settings) -> Path:
    """A run directory as a sweep writes it: run.json (task, model and train configs) + metrics."""
    task = {**TASK, "r": r, **{k: v for k, v in settings.items() if k in TASK}}
    if "data_seed" in settings:
        task["seed"] = settings["data_seed"]
    model = {**MODEL, "seed": seed, **{k: v for k, v in settings.items() if k in MODEL}}
    train = {**TRAIN, **{k: v for k, v in settings.items() if k in TRAIN}}
    run_info = {"task": task}
    if early_stop:
        run_info["early_stop"] = {"rule": "generalized_paper_criterion", "threshold": 1.0}
    run_dir = study / "runs" / name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "run.json", {"key": name, "status": status, "run_info": run_info,
                                             "model_config": model, "train_config": train})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in curve(points)))
    return run_dir


def make_study(root: Path, cells) -> Path:
    """``cells``: (name prefix, r, outcomes list, settings) -> one run per outcome, seeds 0.."""
    for prefix, r, curves, settings in cells:
        for seed, points in enumerate(curves):
            make_run(root, f"{prefix}_s{seed}", r, seed, points, **settings)
    return root
