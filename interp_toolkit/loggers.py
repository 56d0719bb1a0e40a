"""Live loggers for training, sweeps and SGLD: TensorBoard and Weights & Biases.

Both are :class:`interp_toolkit.callbacks.Callback` objects; pass them as ``callbacks=`` to
:func:`interp_toolkit.train`, :func:`interp_toolkit.runs.batched.train_batched`,
:func:`interp_toolkit.studies.sweep.run_sweep` or :func:`interp_toolkit.analyses.bif.bif`.

TensorBoard event files go into each run's own directory, so one command shows every run
of a sweep side by side::

    tensorboard --logdir STUDY_DIR --host 127.0.0.1

Scalars are tagged ``loss/<split>`` and ``accuracy/<split>`` with the epoch as the step, so
TensorBoard groups the splits of a quantity together (see :func:`metric_tag`).

Weights & Biases is optional (``pip install 'interp-toolkit[wandb]'``) and off unless you
create a :class:`WandbLogger`; its default ``mode="offline"`` writes the run under the run
directory without any network (``wandb sync`` uploads it later).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp_toolkit.callbacks import Callback

_QUANTITY_NAMES = {"loss": "loss", "acc": "accuracy"}


def metric_tag(key: str) -> str:
    """Logger tag of a ``metrics.jsonl`` key: ``"val_acc"`` -> ``"accuracy/val"``.

    Keys that are not ``<split>_loss`` / ``<split>_acc`` keep their name.
    """
    split, _, quantity = key.rpartition("_")
    if split and quantity in _QUANTITY_NAMES:
        return f"{_QUANTITY_NAMES[quantity]}/{split}"
    return key


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics line except ``epoch``, keyed by :func:`metric_tag`."""
    return {
        metric_tag(key): float(value) for key, value in metrics.items()
        if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardLogger(Callback):
    """Write every evaluation (and SGLD draw) as TensorBoard scalars.

    Args:
        log_dir: Where SGLD callbacks write (they have no run directory); training runs
            always write into their own run directory. Default for SGLD: ``runs/sgld``.
        sgld_every: Log one SGLD draw in this many (draws can number thousands).

    Needs the ``tensorboard`` package (``pip install tensorboard``).
    """

    def __init__(self, log_dir: str | Path | None = None, sgld_every: int = 1) -> None:
        if isinstance(sgld_every, bool) or not isinstance(sgld_every, int) or sgld_every < 1:
            raise ValueError(f"TensorBoardLogger sgld_every must be a positive integer, got {sgld_every!r}")
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.sgld_every = sgld_every
        self._writers: dict[Path, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Writers hold open files; a copy sent to a sweep worker opens its own.
        return {**self.__dict__, "_writers": {}}

    def _writer(self, directory: Path) -> Any:
        writer = self._writers.get(directory)
        if writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # torch raises this when tensorboard is missing
                raise ImportError("TensorBoardLogger needs tensorboard: pip install tensorboard") from err
            directory.mkdir(parents=True, exist_ok=True)
            writer = self._writers[directory] = SummaryWriter(log_dir=str(directory))
        return writer

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        writer = self._writer(Path(run_dir))
        for tag, value in scalar_metrics(metrics).items():
            writer.add_scalar(tag, value, global_step=int(metrics["epoch"]))
        writer.flush()  # live view: TensorBoard reads what is flushed

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        writer = self._writers.pop(Path(run_dir), None)
        if writer is not None:
            writer.close()

    def _sgld_dir(self) -> Path:
        return self.log_dir if self.log_dir is not None else Path("runs/sgld")

    def on_draw(self, chain: int, draw: int, info: dict[str, float]) -> None:
        if draw % self.sgld_every == 0:
            self._writer(self._sgld_dir()).add_scalar(f"sgld/loss_chain{chain}", info["loss"],
                                                      global_step=int(info["step"]))

    def on_chain_end(self, chain: int, diagnostics: dict[str, float]) -> None:
        writer = self._writer(self._sgld_dir())
        for name, value in diagnostics.items():
            writer.add_scalar(f"sgld_chain/{name}", value, global_step=chain)
        writer.flush()

    def close(self) -> None:
        """Close every open writer (training closes a run's writer when the run ends)."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class WandbLogger(Callback):
    """Log every evaluation to Weights & Biases, one W&B run per training run.

    Args:
        project: W&B project name.
        mode: ``"offline"`` (default: written under ``<run_dir>/wandb``, no network),
            ``"online"`` or ``"disabled"``.
        entity: W&B entity (team or user); ``None`` for the default.
        log_dir: Directory of the W&B run used by SGLD callbacks (default ``runs/sgld``).

    The run's ``run.json`` configs become the W&B run config, and its name is the run
    directory's name. Needs ``pip install 'interp-toolkit[wandb]'``.
    """

    MODES = ("offline", "online", "disabled")

    def __init__(self, project: str = "interp-toolkit", mode: str = "offline",
                 entity: str | None = None, log_dir: str | Path | None = None) -> None:
        if mode not in self.MODES:
            raise ValueError(f"WandbLogger mode must be one of {self.MODES}, got {mode!r}")
        try:
            import wandb  # noqa: F401
        except ImportError as err:
            raise ImportError("WandbLogger needs wandb: pip install 'interp-toolkit[wandb]'") from err
        self.project, self.mode, self.entity = project, mode, entity
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._runs: dict[Path, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_runs": {}}

    def _run(self, directory: Path, name: str) -> Any:
        run = self._runs.get(directory)
        if run is None:
            import wandb

            from interp_toolkit.runs.record import has_record, read_record

            config: dict[str, Any] = {}
            if has_record(directory):
                data = read_record(directory)
                config = {k: data.get(k) for k in ("train_config", "model_config", "run_info", "key")}
            directory.mkdir(parents=True, exist_ok=True)
            run = self._runs[directory] = wandb.init(
                project=self.project, entity=self.entity, mode=self.mode, dir=str(directory),
                name=name, config=config, reinit="create_new",
                settings=wandb.Settings(silent=True, console="off"),
            )
        return run

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        run = self._run(Path(run_dir), Path(run_dir).name)
        run.log({"epoch": int(metrics["epoch"]), **scalar_metrics(metrics)}, step=int(metrics["epoch"]))

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        run = self._runs.pop(Path(run_dir), None)
        if run is not None:
            run.finish()

    def _sgld_run(self) -> Any:
        directory = self.log_dir if self.log_dir is not None else Path("runs/sgld")
        return self._run(directory, directory.name)

    def on_draw(self, chain: int, draw: int, info: dict[str, float]) -> None:
        self._sgld_run().log({f"sgld/loss_chain{chain}": info["loss"], "sgld/step": info["step"]})

    def on_chain_end(self, chain: int, diagnostics: dict[str, float]) -> None:
        self._sgld_run().log({f"sgld_chain{chain}/{k}": v for k, v in diagnostics.items()})

    def close(self) -> None:
        """Finish every open W&B run (training finishes a run's W&B run when it ends)."""
        for run in self._runs.values():
            run.finish()
        self._runs.clear()


def loggers_from_flags(args: Any) -> list[Callback]:
    """The loggers asked for by a command config's ``tensorboard`` (bool) and ``wandb``
    (``None``, ``"offline"`` or ``"online"``) fields (an empty list by default)."""
    loggers: list[Callback] = []
    if getattr(args, "tensorboard", False):
        loggers.append(TensorBoardLogger())
    if getattr(args, "wandb", None):
        loggers.append(WandbLogger(mode=args.wandb))
    return loggers


__all__ = ["TensorBoardLogger", "WandbLogger", "loggers_from_flags", "metric_tag",
           "scalar_metrics"]
