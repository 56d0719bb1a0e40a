"""Live loggers for training, sweeps and SGLD: TensorBoard and Weights & Biases.

Both are :class:`interp_toolkit.callbacks.Callback` objects; pass them as ``callbacks=`` to
:func:`interp_toolkit.train`, :func:`interp_toolkit.runs.batched.train_batched`,
:func:`interp_toolkit.studies.sweep.run.run_sweep` or :func:`interp_toolkit.analyses.bif.bif`.

TensorBoard event files go into each run's own directory, so one command shows every run
of a sweep side by side::

    tensorboard --logdir STUDY_DIR --host 127.0.0.1

Scalars are tagged ``loss/<split>`` and ``accuracy/<split>`` with the epoch as the step, so
TensorBoard groups the splits of a quantity together (see :func:`metric_tag`).

Each run's TensorBoard directory also gets its hyperparameters (the run's task, model and
training configs, flattened: ``task.r``, ``model.n_layers``, ``train.lr`` ...) when the run
ends, so the HPARAMS tab of a sweep's ``--logdir`` tabulates every run against its final
accuracies and losses (:func:`log_hparams`). A W&B run gets the same names as its config.

Weights & Biases is optional (``pip install 'interp-toolkit[wandb]'``) and off unless you
create a :class:`WandbLogger`; its default ``mode="offline"`` writes the run under the run
directory without any network (``wandb sync`` uploads it later). The W&B run id is the
toolkit's run key (``run.json``'s ``key``) with ``resume="allow"``, so a run resumed after an
interruption continues the same W&B run instead of starting a second one (an extended run is
a run of its own, with its own key); ``group`` groups runs (a
sweep's study), and :meth:`WandbLogger.log_analysis` adds an analysis's tables and figures to
the run as an artifact (plus W&B tables and images for the browser).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, cast

from interp_toolkit.callbacks import Callback
from interp_toolkit.errors import UserError

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


def _read_record(run_dir: Path) -> dict[str, Any]:
    from interp_toolkit.runs.record import has_record, read_record

    return read_record(run_dir) if has_record(run_dir) else {}


def _hparam_value(value: Any) -> bool | int | float | str:
    # TensorBoard's HParams plugin takes bools, numbers and strings only
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


def hparams_of_record(record: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """A run record's configs flattened to TensorBoard hyperparameters.

    ``run_info.task`` becomes ``task.<field>``, ``model_config`` ``model.<field>``,
    ``train_config`` ``train.<field>`` and other scalar ``run_info`` entries ``info.<name>``;
    ``None`` and lists become their JSON text (``"null"``, ``"[0.9, 0.98]"``).

    Args:
        record: The contents of a run's ``run.json``.
    """
    out: dict[str, bool | int | float | str] = {}
    run_info = record.get("run_info") or {}
    sections = (("task", run_info.get("task")), ("model", record.get("model_config")),
                ("train", record.get("train_config")))
    for prefix, section in sections:
        for name, value in sorted((section or {}).items()):
            out[f"{prefix}.{name}"] = _hparam_value(value)
    for name, value in sorted(run_info.items()):
        if name != "task" and not isinstance(value, (dict, list)):
            out[f"info.{name}"] = _hparam_value(value)
    return out


def log_hparams(writer: Any, run_dir: str | Path, final: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the run's hyperparameters (:func:`hparams_of_record`) into its TensorBoard run.

    The HParams plugin then lists the run with its final scalars (``accuracy/<split>``,
    ``loss/<split>``, already logged as scalars of the same run, so nothing is written twice).

    Args:
        writer: A ``torch.utils.tensorboard.SummaryWriter`` writing into ``run_dir``.
        run_dir: The run directory (its ``run.json`` gives the configs).
        final: The run's final metrics (their tags become the HParams metrics); default:
            ``run.json``'s ``final``.

    Returns:
        The hyperparameters written (empty, and nothing written, when the run has no record).
    """
    from torch.utils.tensorboard.summary import hparams

    record = _read_record(Path(run_dir))
    params = hparams_of_record(record)
    if not params:
        return {}
    metrics = scalar_metrics(dict(final if final is not None else record.get("final") or {}))
    experiment, session_start, session_end = hparams(params, dict.fromkeys(metrics, 0.0))
    file_writer = writer._get_file_writer()
    for summary in (experiment, session_start, session_end):
        file_writer.add_summary(summary)
    writer.flush()
    return params


class TensorBoardLogger(Callback):
    """Write every evaluation (and SGLD draw) as TensorBoard scalars.

    Args:
        log_dir: Where SGLD callbacks write (they have no run directory); training runs
            always write into their own run directory. Default for SGLD: ``runs/sgld``.
        sgld_every: Log one SGLD draw in this many (draws can number thousands).
        hparams: When a run ends, write its hyperparameters (:func:`log_hparams`), so a
            sweep's runs can be compared in TensorBoard's HPARAMS tab.

    Needs the ``tensorboard`` package (``pip install tensorboard``).
    """

    def __init__(self, log_dir: str | Path | None = None, sgld_every: int = 1, hparams: bool = True) -> None:
        if isinstance(sgld_every, bool) or not isinstance(sgld_every, int) or sgld_every < 1:
            raise UserError(f"TensorBoardLogger sgld_every must be a positive integer, got {sgld_every!r}")
        if not isinstance(hparams, bool):
            raise UserError(f"TensorBoardLogger hparams must be True or False, got {hparams!r}")
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.sgld_every = sgld_every
        self.hparams = hparams
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
            if self.hparams:
                log_hparams(writer, run_dir, final)
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
        group: W&B group of the runs (e.g. a sweep's study name); ``None`` for none.

    The W&B run id is the run's key (``run.json``'s ``key``) and W&B is told
    ``resume="allow"``: a run resumed after an interruption logs into the same W&B run
    (offline, each invocation writes its own directory under that id; ``wandb sync`` uploads
    them to the one run). The run's ``run.json`` configs become the W&B run config,
    and its name is the run directory's name. Needs ``pip install 'interp-toolkit[wandb]'``.
    """

    MODES = ("offline", "online", "disabled")

    def __init__(self, project: str = "interp-toolkit", mode: str = "offline",
                 entity: str | None = None, log_dir: str | Path | None = None,
                 group: str | None = None) -> None:
        if mode not in self.MODES:
            raise UserError(f"WandbLogger mode must be one of {self.MODES}, got {mode!r}")
        for name, value, optional in (("project", project, False), ("entity", entity, True),
                                      ("group", group, True)):
            if (value is None and not optional) or (value is not None and (not isinstance(value, str)
                                                                           or not value.strip())):
                raise UserError(f"WandbLogger {name} must be a non-empty string"
                                 f"{' or None' if optional else ''}, got {value!r}")
        try:
            import wandb  # noqa: F401
        except ImportError as err:
            raise ImportError("WandbLogger needs wandb: pip install 'interp-toolkit[wandb]'") from err
        if mode == "online" and not has_wandb_credentials():
            # Refused here, before any run directory is made: wandb.init would fail at the
            # first evaluation, leaving a half-started run.
            raise UserError("W&B online logging needs an API key, and none was found (no WANDB_API_KEY, no "
                            "api.wandb.ai entry in ~/.netrc); run `wandb login` or set WANDB_API_KEY, or log "
                            "offline (--wandb offline) and `wandb sync` later")
        self.project, self.entity, self.group = project, entity, group
        self.mode = cast(Literal["offline", "online", "disabled"], mode)  # one of MODES, checked above
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._runs: dict[Path, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_runs": {}}

    def _run(self, directory: Path, name: str) -> Any:
        run = self._runs.get(directory)
        if run is None:
            import wandb

            data = _read_record(directory)
            # the names TensorBoard's hyperparameters have (task.r, model.n_layers, train.lr, ...)
            config: dict[str, Any] = {**hparams_of_record(data), "key": data.get("key")} if data else {}
            key = data.get("key")
            directory.mkdir(parents=True, exist_ok=True)
            try:
                run = wandb.init(
                    project=self.project, entity=self.entity, group=self.group, mode=self.mode,
                    dir=str(directory), name=name, config=config, reinit="create_new",
                    id=key if isinstance(key, str) and key else None,
                    resume="allow" if isinstance(key, str) and key else None,
                    settings=wandb.Settings(silent=True, console="off"),
                )
            except Exception as err:  # noqa: BLE001 - wandb raises its own types for login/network
                raise UserError(f"W&B could not start a {self.mode} run for {directory}: "
                                f"{type(err).__name__}: {err}; the run stays resumable (rerun once W&B "
                                f"works, or without --wandb)") from err
            self._runs[directory] = run
        return run

    def on_evaluation(self, run_dir: Path, metrics: dict[str, Any]) -> None:
        run = self._run(Path(run_dir), Path(run_dir).name)
        run.log({"epoch": int(metrics["epoch"]), **scalar_metrics(metrics)}, step=int(metrics["epoch"]))

    def on_run_end(self, run_dir: Path, final: dict[str, Any]) -> None:
        run = self._runs.pop(Path(run_dir), None)
        if run is not None:
            run.finish()

    def log_analysis(self, run_dir: str | Path, name: str, files: Sequence[str | Path]) -> Any:
        """Add an analysis's output files to the run's W&B run as one artifact.

        The artifact (type ``"analysis"``, named ``<run key>-<name>``) holds the files as
        they are; besides, each ``.csv`` is logged as a W&B table ``<name>/tables/<file stem>``
        and each ``.png`` as an image ``<name>/figures/<file stem>``, to browse them in the W&B
        interface. The W&B
        run is the training run's (same id, resumed), finished again afterwards unless
        this logger holds it open.

        Args:
            run_dir: The analysed run's directory (its ``run.json`` gives the W&B run id).
            name: The analysis (``fingerprints``, ``mechanism`` ...): artifact name and
                key prefix.
            files: The files to log (tables and figures the analysis wrote).

        Returns:
            The logged ``wandb.Artifact``.
        """
        import wandb

        run_dir = Path(run_dir)
        paths = [Path(f) for f in files]
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"log_analysis name must be a non-empty string, got {name!r}")
        missing = [str(p) for p in paths if not p.is_file()]
        if not paths or missing:
            raise UserError(f"log_analysis needs existing files, got {[str(p) for p in paths]}"
                             + (f" (missing: {missing})" if missing else ""))
        held = run_dir in self._runs
        run = self._run(run_dir, run_dir.name)
        key = _read_record(run_dir).get("key") or run_dir.name
        artifact = wandb.Artifact(f"{key}-{name}", type="analysis", metadata={"run_dir": str(run_dir)})
        media: dict[str, Any] = {}
        for path in paths:
            artifact.add_file(str(path), name=path.name)
            if path.suffix == ".csv":
                media[f"{name}/tables/{path.stem}"] = _csv_table(path)
            elif path.suffix == ".png":
                media[f"{name}/figures/{path.stem}"] = wandb.Image(str(path))
        run.log_artifact(artifact)
        if media:
            run.log(media)
        if not held:
            self._runs.pop(run_dir, None)
            run.finish()
        return artifact

    def _sgld_run(self) -> Any:
        directory = self.log_dir if self.log_dir is not None else Path("runs/sgld")
        fresh = directory not in self._runs
        run = self._run(directory, directory.name)
        if fresh:  # the draws' curves against the SGLD step, not W&B's own log-call counter
            run.define_metric("sgld/step")
            run.define_metric("sgld/*", step_metric="sgld/step")
        return run

    def on_draw(self, chain: int, draw: int, info: dict[str, float]) -> None:
        self._sgld_run().log({f"sgld/loss_chain{chain}": info["loss"], "sgld/step": info["step"]})

    def on_chain_end(self, chain: int, diagnostics: dict[str, float]) -> None:
        self._sgld_run().log({f"sgld_chain{chain}/{k}": v for k, v in diagnostics.items()})

    def close(self) -> None:
        """Finish every open W&B run (training finishes a run's W&B run when it ends)."""
        for run in self._runs.values():
            run.finish()
        self._runs.clear()


def has_wandb_credentials() -> bool:
    """Whether a W&B API key can be found without prompting: ``WANDB_API_KEY``, or an entry
    for the W&B host (``WANDB_BASE_URL``, default api.wandb.ai) in ``~/.netrc`` (or
    ``NETRC``), where ``wandb login`` stores it."""
    import netrc
    import os
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def _cell(text: str) -> Any:
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _csv_table(path: Path) -> Any:
    import wandb

    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        return wandb.Table(columns=["empty"], data=[])
    header: list[str | int] = list(rows[0])  # wandb.Table wants list[str | int] (list is invariant)
    data = [[_cell(v) if v != "" else math.nan for v in row] for row in rows[1:]]
    return wandb.Table(columns=header, data=data)


def loggers_from_flags(args: Any, group: str | None = None) -> list[Callback]:
    """The loggers asked for by a command config's fields (an empty list by default).

    Fields read: ``tensorboard`` (bool), ``wandb`` (``None``, ``"offline"`` or
    ``"online"``), and where present ``wandb_project``, ``wandb_entity`` and
    ``wandb_group``.

    Args:
        args: The command's config.
        group: W&B group used when ``args`` sets none (a sweep passes its study's name).
    """
    loggers: list[Callback] = []
    if getattr(args, "tensorboard", False):
        loggers.append(TensorBoardLogger())
    wandb_logger = wandb_logger_from_flags(args, group)
    if wandb_logger is not None:
        loggers.append(wandb_logger)
    return loggers


def wandb_logger_from_flags(args: Any, group: str | None = None) -> WandbLogger | None:
    """The W&B logger asked for by a command config's ``wandb`` fields (as
    :func:`loggers_from_flags` reads them), or None without ``--wandb``. Built before any
    work, so a missing W&B install or API key is refused first."""
    if not getattr(args, "wandb", None):
        return None
    return WandbLogger(project=getattr(args, "wandb_project", None) or "interp-toolkit", mode=args.wandb,
                       entity=getattr(args, "wandb_entity", None), group=getattr(args, "wandb_group", None) or group)


__all__ = ["TensorBoardLogger", "WandbLogger", "has_wandb_credentials", "hparams_of_record", "log_hparams",
           "loggers_from_flags", "metric_tag", "scalar_metrics", "wandb_logger_from_flags"]
