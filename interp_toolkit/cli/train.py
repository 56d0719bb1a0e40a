"""``interp-toolkit train``: train one MPSP model with checkpoints.

Flags are generated from the fields of ``MPSPConfig`` (``--task.r``), ``ModelConfig``
(``--model.n-layers``) and ``TrainConfig`` (``--train.epochs``), with the short names of
earlier versions as aliases (``--r``, ``--n-layers``, ``--epochs``, ...); a JSON/YAML config
file (``--config``) with sections ``task``, ``model``, ``train`` and ``run_dir`` sets them and
flags override it. Reruns of a finished run recompute nothing; an interrupted run resumes
from its last saved epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp_toolkit.runs.layout import METRICS

HELP = "train one MPSP model with checkpoints"
# The names of interp_toolkit.tasks.mpsp.TASKS, spelled out so that importing this module needs no torch.
TASK_NAMES = ["first_mod3_sum_mod3", "first_parity_sum_parity", "max_mod3_sum_mod3", "max_parity_sum_parity"]
# Flag names of earlier versions -> the generated flags (both work).
ALIASES: dict[str, str | list[str]] = {
    "--task": "--task-name", "--r": "--task.r", "--seq-len": "--task.seq-len", "--n-values": "--task.n-values",
    "--n-train": "--task.n-train", "--n-eval": "--task.n-eval", "--data-seed": "--task.seed",
    "--n-layers": "--model.n-layers", "--n-heads": "--model.n-heads", "--d-model": "--model.d-model",
    "--d-mlp": "--model.d-mlp", "--attn-only": "--model.attn-only",
    "--no-layernorm": ["--model.normalization", "None"], "--model-seed": "--model.seed",
    "--epochs": "--train.epochs", "--lr": "--train.lr", "--weight-decay": "--train.weight-decay",
    "--batch-size": "--train.batch-size", "--eval-every": "--train.eval-every",
    "--checkpoint-every": "--train.checkpoint-every", "--no-log-checkpoints": "--train.no-checkpoint-log-spaced",
    "--quiet": "--train.no-progress", "--device": "--train.device",
}
DESCRIPTION = ("Train one MPSP model. Reruns of a finished run recompute nothing; an interrupted run resumes "
               "from its last saved epoch. Every field of the task (MPSPConfig), model (ModelConfig) and "
               "training (TrainConfig) configs is a flag; --config FILE (JSON/YAML with sections task, model, "
               "train, run_dir) sets them and flags override it. Short flags of earlier versions still work: "
               + ", ".join(f"{old} = {new if isinstance(new, str) else ' '.join(new)}" for old, new in ALIASES.items())
               + ".")


_COMMAND_CONFIG: list[type] = []


def command_config_class() -> type:
    """``TrainCommandConfig``, built on first use (importing this module stays cheap).

    Fields: ``task_name`` (sets task.label/shortcut), ``task`` (MPSPConfig), ``model``
    (ModelConfig; vocabulary and context sizes always follow the task), ``train``
    (TrainConfig; its ``device`` is the command's ``--device``), ``run_dir``, ``overwrite``.
    """
    if _COMMAND_CONFIG:
        return _COMMAND_CONFIG[0]
    import dataclasses
    from typing import Literal, Optional

    from interp_toolkit.config import Config
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    def default_model() -> ModelConfig:
        model = ModelConfig(n_layers=1, n_heads=2, **MPSPConfig().model_dims())
        model.d_head = None  # derived from d_model / n_heads unless given
        return model

    def post_init(self: Any) -> None:
        if isinstance(self.task, dict):
            self.task = MPSPConfig.from_dict(self.task)
        if self.task_name is not None:
            self.task = MPSPConfig.from_task(self.task_name, **{
                k: v for k, v in self.task.to_dict().items() if k not in ("label", "shortcut")})
        model = dict(self.model) if isinstance(self.model, dict) else self.model.to_dict()
        self.model = ModelConfig.from_dict({**model, **self.task.model_dims()})
        if isinstance(self.train, dict):
            self.train = TrainConfig.from_dict(self.train)
        if isinstance(self.run_dir, str):
            self.run_dir = Path(self.run_dir)
        if isinstance(self.extend_from, str):
            self.extend_from = Path(self.extend_from)

    task_name = Literal[tuple(TASK_NAMES)]  # type: ignore[valid-type]
    cls = dataclasses.make_dataclass(
        "TrainCommandConfig",
        [("task_name", Optional[task_name], dataclasses.field(default=None)),  # noqa: UP007 - read by tyro
         ("task", MPSPConfig, dataclasses.field(default_factory=MPSPConfig)),
         ("model", ModelConfig, dataclasses.field(default_factory=default_model)),
         ("train", TrainConfig, dataclasses.field(default_factory=TrainConfig)),
         ("run_dir", Optional[Path], dataclasses.field(default=None)),  # noqa: UP007
         ("overwrite", bool, dataclasses.field(default=False)),
         ("extend_from", Optional[Path], dataclasses.field(default=None)),  # noqa: UP007
         ("format", Literal["png", "svg", "pdf"], dataclasses.field(default="png")),
         ("tensorboard", bool, dataclasses.field(default=False)),
         ("wandb", Optional[Literal["offline", "online"]], dataclasses.field(default=None))],  # noqa: UP007
        bases=(Config,),
        namespace={"__post_init__": post_init, "__module__": __name__, "__doc__": """Settings of ``interp-toolkit train``.

    Attributes:
        task_name: Task variant (sets task.label and task.shortcut); default: from them.
        task: The MPSP data.
        model: The architecture (vocabulary and context sizes always follow the task).
        train: Optimization and bookkeeping, and where to train (``train.device``, also
            spelled ``--device``: cpu, cuda, cuda:N or auto; default cpu).
        run_dir: Run directory (default runs/<task>_<L>L<H>H_r<r>_s<seed>_<key>).
        overwrite: Move whatever the run directory holds aside to RUN_DIR.old-TIMESTAMP (never
            deleted) and train from scratch.
        extend_from: A finished run of this run at fewer epochs (same task, model and training
            settings but --train.epochs): continue from its final state instead of epoch 0, ending
            as training from scratch would.
        format: File format of the training curves (curves.png is always written;
            svg or pdf adds curves.svg / curves.pdf beside it).
        tensorboard: Write TensorBoard event files into the run directory.
        wandb: Log to Weights & Biases (offline: under the run directory, no network).
    """},
    )
    _COMMAND_CONFIG.append(cls)
    return cls


def _prepare(data: dict[str, Any]) -> dict[str, Any]:
    """Config-file layouts of earlier versions: ``task: {task: NAME, ...}``; a top-level
    ``device`` (now ``train.device``)."""
    task = dict(data.get("task") or {})
    if "task" in task:
        data = {**data, "task_name": task.pop("task"), "task": task}
    if "device" in data:
        data = dict(data)
        device = data.pop("device")
        train = data.get("train") or {}
        train = dict(train) if isinstance(train, dict) else train.to_dict()
        if train.get("device") is None:
            train["device"] = device
        data["train"] = train
    return data


def parse(argv: list[str], prog: str = "interp-toolkit train") -> Any:
    """``argv`` (after ``train``) -> a validated ``TrainCommandConfig``."""
    import dataclasses

    from interp_toolkit.config import load_config_file, parse_config, split_config_flag

    cls = command_config_class()
    cfg = parse_config(cls, argv, prog=prog, description=DESCRIPTION, aliases=ALIASES, prepare=_prepare,
                       prefixes=True)
    # d_head follows d_model / n_heads unless it was given (the default instance holds a derived value)
    config_file, rest = split_config_flag(argv)
    from_file = config_file is not None and "d_head" in (load_config_file(config_file).get("model") or {})
    if not from_file and not any(t.split("=")[0] == "--model.d-head" for t in rest):
        cfg.model = dataclasses.replace(cfg.model, d_head=None)
    return cfg


def default_run_dir(task_cfg: Any, model_cfg: Any, train_cfg: Any) -> Path:
    """``runs/<task>_<L>L<H>H_r<r>_s<seed>_<key>``: distinct configs, distinct directories.

    Where and with which engine a run trains (``train.device``, ``train.engine``) changes how,
    not what, it computes: not part of the name.
    """
    from interp_toolkit.io import config_hash

    train = {k: v for k, v in train_cfg.to_dict().items() if k not in ("device", "engine")}
    key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(), "train": train}, 8)
    return Path(f"runs/{task_cfg.name}_{model_cfg.n_layers}L{model_cfg.n_heads}H_r{task_cfg.r:g}"
                f"_s{model_cfg.seed}_{key}")


def train_mpsp(task_cfg: Any, model_cfg: Any, train_cfg: Any, run_dir: Path, device: str | None = None,
               overwrite: bool = False, callbacks: Any = None, extend_from: Path | None = None) -> Any:
    """Build the splits and model for an MPSP run and train it (resuming if possible).

    ``device`` (default ``train_cfg.device``, else the CPU) is where the model is built and
    trained; it becomes ``train_cfg.device``. ``overwrite``, ``extend_from``: see
    :func:`~interp_toolkit.runs.trainer.train`.
    """
    import dataclasses

    from interp_toolkit.devices import resolve_device
    from interp_toolkit.model import build_model
    from interp_toolkit.runs.trainer import train
    from interp_toolkit.tasks.mpsp import make_splits

    device = device if device is not None else (train_cfg.device or "cpu")
    resolved = resolve_device(device)  # a bad or unavailable device fails before any work
    if train_cfg.device != device:
        train_cfg = dataclasses.replace(train_cfg, device=device)
    splits = make_splits(task_cfg)
    model = build_model(model_cfg, device=resolved)
    return train(model, splits, train_cfg, run_dir, run_info={"task": {"name": task_cfg.name, **task_cfg.to_dict()}},
                 overwrite=overwrite, callbacks=callbacks, extend_from=extend_from)


def run_config(cfg: Any) -> int:
    """``interp-toolkit train``: returns 0; bad input raises a user error (exit 2 in ``main``)."""
    run_dir = cfg.run_dir or default_run_dir(cfg.task, cfg.model, cfg.train)
    from interp_toolkit.loggers import loggers_from_flags
    from interp_toolkit.runs.record import read_record

    result = train_mpsp(cfg.task, cfg.model, cfg.train, run_dir, overwrite=cfg.overwrite,
                        callbacks=loggers_from_flags(cfg), extend_from=cfg.extend_from)
    curves = write_curves(result, run_dir, cfg.format)
    origin = (read_record(run_dir).get("extended_from") or {}) if result.resumed_from is not None else {}
    status = "already finished (nothing retrained)" if result.already_finished else (
        f"extended {origin.get('run_dir')} from epoch {result.resumed_from}" if origin else
        f"resumed from epoch {result.resumed_from}" if result.resumed_from is not None else "trained")
    print(f"{run_dir}: {status}")
    print(format_metrics(result.final))
    print(f"curves: {curves}")
    return 0


def interrupted_at(cfg: Any) -> int | None:
    """The epoch an interrupted ``train`` resumes from: its last logged (and saved) evaluation."""
    from interp_toolkit.io import read_jsonl

    metrics = read_jsonl(Path(cfg.run_dir or default_run_dir(cfg.task, cfg.model, cfg.train)) / METRICS)
    return int(metrics[-1]["epoch"]) if metrics else None


def write_curves(result: Any, run_dir: Path, figure_format: str) -> Path:
    """The run's training-curves figure in ``figure_format`` (``curves.png`` is written by
    ``train`` itself; svg/pdf are added beside it). Returns its path."""
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.runs.trainer import plot_training_curves

    figure_format = check_format(figure_format)
    path = Path(run_dir) / f"curves.{figure_format}"
    if figure_format != "png" and result.metrics:
        save_figure(plot_training_curves(result.metrics), path)
    return path


def format_metrics(metrics: dict[str, Any]) -> str:
    parts = [f"epoch {metrics.get('epoch', '?')}"]
    for key in sorted(metrics):
        if key.endswith("_acc"):
            parts.append(f"{key} {metrics[key]:.4f}")
    for key in sorted(metrics):
        if key.endswith("_loss"):
            parts.append(f"{key} {metrics[key]:.4g}")
    return "  ".join(parts)


__all__ = ["ALIASES", "DESCRIPTION", "HELP", "TASK_NAMES", "command_config_class", "default_run_dir",
           "format_metrics", "interrupted_at", "write_curves", "parse", "run_config", "train_mpsp"]
