"""``interp-toolkit train``: train one MPSP model with checkpoints.

Flags are generated from the fields of ``MPSPConfig`` (``--task.r``), ``ModelConfig``
(``--model.n-layers``) and ``TrainConfig`` (``--train.epochs``), as every command spells a
nested config's fields; short spellings: the table ``sweep`` shares
(:data:`~interp_toolkit.cli.flags.SHORT_FLAGS`: ``--lr``, ``--epochs``, ``--seq-len`` ...),
train's own (:data:`ALIASES`: ``--quiet``, ``--model-seed`` ...) and any field's own name where
no other section has it (``--r``, ``--n-layers``); a JSON/YAML config
file (``--config``) with sections ``task``, ``model``, ``train`` and ``run_dir`` sets them and
flags override it. Reruns of a finished run recompute nothing; an interrupted run resumes
from its last saved epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from interp_toolkit.cli.flags import SHORT_FLAGS, short_flags_text
from interp_toolkit.errors import UserError
from interp_toolkit.runs.mpsp import default_run_dir, format_metrics, last_logged_epoch, run_mpsp

# The names of interp_toolkit.tasks.mpsp.TASKS, spelled out so that importing this module needs no torch.
TASK_NAMES = ["first_mod3_sum_mod3", "first_parity_sum_parity", "max_mod3_sum_mod3", "max_parity_sum_parity"]
# The short spellings (the shared table, then train's own) -> the generated flags (both work).
ALIASES: dict[str, str | list[str]] = {
    **SHORT_FLAGS, "--task": "--task-name", "--r": "--task.r",
    "--n-layers": "--model.n-layers", "--n-heads": "--model.n-heads", "--attn-only": "--model.attn-only",
    "--no-layernorm": ["--model.normalization", "None"], "--model-seed": "--model.seed",
    "--weight-decay": "--train.weight-decay", "--no-log-checkpoints": "--train.no-checkpoint-log-spaced",
    "--quiet": "--train.no-progress", "--device": "--train.device",
}
DESCRIPTION = ("Train one model on MPSP, or on a task of your own with --task-factory FILE.py:FUNCTION. "
               "Reruns of a finished run recompute nothing; an interrupted run resumes "
               "from its last saved epoch. Every field of the task (MPSPConfig), model (ModelConfig) and "
               "training (TrainConfig) configs is a flag; --config FILE (JSON/YAML with sections task, model, "
               "train, run_dir) sets them and flags override it. Short flags: " + short_flags_text(ALIASES) + ".")


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
        self.custom_task = None
        if isinstance(self.task_settings, dict):  # a config file's mapping
            import json

            self.task_settings = json.dumps(self.task_settings)
        if self.task_factory is not None:
            self.custom_task = custom_task_of(self.task_factory, self.task_settings)
        elif self.task_settings is not None:
            raise UserError("--task-settings applies to a custom task: give --task-factory MODULE:FUNCTION too")
        if self.task_name is not None:
            self.task = MPSPConfig.from_task(self.task_name, **{
                k: v for k, v in self.task.to_dict().items() if k not in ("label", "shortcut")})
        model = dict(self.model) if isinstance(self.model, dict) else self.model.to_dict()
        self.model = ModelConfig.from_dict({**model, **self.data_task().model_dims()})
        if isinstance(self.train, dict):
            self.train = TrainConfig.from_dict(self.train)
        if isinstance(self.run_dir, str):
            self.run_dir = Path(self.run_dir)
        if isinstance(self.extend_from, str):
            self.extend_from = Path(self.extend_from)

    def data_task(self: Any) -> Any:
        """The task trained on: the custom task when --task-factory is given, else ``task``."""
        return self.custom_task if self.custom_task is not None else self.task

    task_name = Literal[tuple(TASK_NAMES)]  # type: ignore[valid-type]
    cls = dataclasses.make_dataclass(
        "TrainCommandConfig",
        [("task_name", Optional[task_name], dataclasses.field(default=None)),  # noqa: UP007 - read by tyro
         ("task", MPSPConfig, dataclasses.field(default_factory=MPSPConfig)),
         ("task_factory", Optional[str], dataclasses.field(default=None)),  # noqa: UP007
         ("task_settings", Optional[str], dataclasses.field(default=None)),  # noqa: UP007
         ("model", ModelConfig, dataclasses.field(default_factory=default_model)),
         ("train", TrainConfig, dataclasses.field(default_factory=TrainConfig)),
         ("run_dir", Optional[Path], dataclasses.field(default=None)),  # noqa: UP007
         ("overwrite", bool, dataclasses.field(default=False)),
         ("extend_from", Optional[Path], dataclasses.field(default=None)),  # noqa: UP007
         ("format", Literal["png", "svg", "pdf"], dataclasses.field(default="png")),
         ("tensorboard", bool, dataclasses.field(default=False)),
         ("wandb", Optional[Literal["offline", "online"]], dataclasses.field(default=None)),  # noqa: UP007
         ("wandb_project", str, dataclasses.field(default="interp-toolkit")),
         ("wandb_entity", Optional[str], dataclasses.field(default=None)),  # noqa: UP007
         ("wandb_group", Optional[str], dataclasses.field(default=None))],  # noqa: UP007
        bases=(Config,),
        namespace={"__post_init__": post_init, "data_task": data_task, "__module__": __name__,
                   "__doc__": """Settings of ``interp-toolkit train``.

    Attributes:
        task_name: Task variant (sets task.label and task.shortcut); default: from them.
        task: The MPSP data.
        task_factory: Your own task instead of MPSP: a function returning its splits, as
            package.module:function, path/to/file.py:function or an installed entry point
            (docs/custom_tasks.md). The run records it, so every command rebuilds its data.
        task_settings: Keyword arguments of the task factory, a JSON object (in a config
            file: a mapping).
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
        wandb: Log to Weights & Biases (offline: under the run directory, no network). The
            W&B run id is the run key, so a resumed run continues its W&B run.
        wandb_project: W&B project of the run (with --wandb).
        wandb_entity: W&B entity (team or user); unset: your default entity.
        wandb_group: W&B group of the run (e.g. the study it belongs to).
    """},
    )
    _COMMAND_CONFIG.append(cls)
    return cls


def custom_task_of(factory: str, settings: str | None) -> Any:
    """The :class:`~interp_toolkit.tasks.custom.CustomTask` of ``--task-factory`` and
    ``--task-settings`` (a JSON object), its splits built and checked (UserError naming
    the bad value)."""
    import json

    from interp_toolkit.tasks.custom import CustomTask

    values: Any = {}
    if settings is not None:
        try:
            values = json.loads(settings)
        except json.JSONDecodeError as err:
            raise UserError(f"--task-settings {settings!r} is not JSON ({err.msg}); expected an object such as "
                            "'{\"n_train\": 512}'") from None
        if not isinstance(values, dict):
            raise UserError(f"--task-settings {settings!r}: expected a JSON object of factory keyword -> value")
    try:
        task = CustomTask(factory, values)
        task.model_dims()  # builds and checks the splits: a bad factory fails before any training
    except (ValueError, UserError, TypeError) as err:
        raise UserError(str(err)) from err
    return task


def parse(argv: list[str], prog: str = "interp-toolkit train") -> Any:
    """``argv`` (after ``train``) -> a validated ``TrainCommandConfig``."""
    import dataclasses

    from interp_toolkit.config import load_config_file, parse_config, split_config_flag

    cls = command_config_class()
    cfg: Any = parse_config(cls, argv, prog=prog, description=DESCRIPTION, aliases=ALIASES)
    # d_head follows d_model / n_heads unless it was given (the default instance holds a derived value)
    config_file, rest = split_config_flag(argv)
    from_file = config_file is not None and "d_head" in (load_config_file(config_file).get("model") or {})
    if not from_file and not any(t.split("=")[0] == "--model.d-head" for t in rest):
        cfg.model = dataclasses.replace(cfg.model, d_head=None)
    file_data = load_config_file(config_file) if config_file is not None else {}
    if cfg.custom_task is not None:
        mpsp_flags = [t.split("=")[0] for t in rest if t.split("=")[0].startswith("--task.")
                      or str(ALIASES.get(t.split("=")[0], "")).startswith(("--task.", "--task-name"))]
        if file_data.get("task") or mpsp_flags:
            given = mpsp_flags[0] if mpsp_flags else "the config file's task section"
            raise UserError(f"{given} sets the MPSP task, but --task-factory {cfg.task_factory} trains a custom "
                            "task; its settings go in --task-settings (task_settings in a config file)")
    refuse_conflicts(cfg, _explicit_values(rest, file_data))
    return cfg


#: Settings that follow from others: given explicitly, they must agree.
_DERIVED_MODEL = ("d_vocab", "n_ctx", "d_vocab_out")
_NAMED_TASK = ("label", "shortcut")


def _explicit_values(rest: list[str], file_data: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """``"model.d_vocab" -> (where, value)`` for the derived model sizes and the task's label
    and shortcut that the user gave explicitly (a flag, or the config file's section)."""
    found: dict[str, tuple[str, Any]] = {}
    sections = {"model": _DERIVED_MODEL, "task": _NAMED_TASK}
    for section, names in sections.items():
        section_data = file_data.get(section)
        given = section_data if isinstance(section_data, dict) else {}
        for name in names:
            if name in given:
                found[f"{section}.{name}"] = (f"{section}.{name} in the config file", given[name])
    for i, token in enumerate(rest):
        flag, eq, value = token.partition("=")
        if not flag.startswith("--"):
            continue
        dotted = flag[2:].replace("-", "_")
        section, _, name = dotted.partition(".")
        if name in sections.get(section, ()):
            if not eq:
                value = rest[i + 1] if i + 1 < len(rest) else ""
            found[f"{section}.{name}"] = (f"--{section}.{name.replace('_', '-')} {value}", value)
    return found


def refuse_conflicts(cfg: Any, explicit: dict[str, tuple[str, Any]]) -> None:
    """UserError when an explicitly given setting disagrees with what the task fixes: the
    model's ``d_vocab``, ``n_ctx`` and ``d_vocab_out`` follow the task (a value the task
    does not need would otherwise be silently replaced), and ``--task-name`` fixes the
    task's label and shortcut."""
    if cfg.custom_task is not None and cfg.task_name is not None:
        raise UserError(f"--task-name {cfg.task_name} sets the MPSP task, but --task-factory {cfg.task_factory} "
                        "trains a custom task; its settings go in --task-settings")
    dims = cfg.data_task().model_dims()
    for name in _DERIVED_MODEL:
        where, value = explicit.get(f"model.{name}", (None, None))
        if where is not None and str(value) != str(dims[name]):
            about = (f"{cfg.task.name} (seq_len {cfg.task.seq_len}, n_values {cfg.task.n_values})"
                     if cfg.custom_task is None else f"the custom task {cfg.custom_task.name} (by its data)")
            raise UserError(f"{where} conflicts with the task: {about} needs model.{name} = {dims[name]}; the model's "
                            f"vocabulary, context and output sizes follow the task, so leave the flag out "
                            f"(or change the task)")
    if cfg.task_name is not None:
        from interp_toolkit.tasks.mpsp import TASKS

        named = dict(zip(_NAMED_TASK, TASKS[cfg.task_name], strict=True))
        for name in _NAMED_TASK:
            where, value = explicit.get(f"task.{name}", (None, None))
            if where is not None and str(value) != named[name]:
                raise UserError(f"{where} conflicts with --task-name {cfg.task_name}, whose {name} is "
                                f"{named[name]!r}; give one of them")


def run_config(cfg: Any) -> int:
    """``interp-toolkit train``: returns 0; bad input raises a user error (exit 2 in ``main``)."""
    from interp_toolkit.loggers import loggers_from_flags

    run = run_mpsp(cfg.data_task(), cfg.model, cfg.train, cfg.run_dir, overwrite=cfg.overwrite,
                   callbacks=loggers_from_flags(cfg), extend_from=cfg.extend_from, figure_format=cfg.format)
    result, origin = run.result, run.extended_from
    status = "already finished (nothing retrained)" if result.already_finished else (
        f"extended {origin.get('run_dir')} from epoch {result.resumed_from}" if origin else
        f"resumed from epoch {result.resumed_from}" if result.resumed_from is not None else "trained")
    print(f"{run.run_dir}: {status}")
    print(format_metrics(result.final))
    print(f"curves: {run.curves}")
    return 0


def interrupted_at(cfg: Any) -> int | None:
    """The epoch an interrupted ``train`` resumes from: its last logged (and saved) evaluation."""
    return last_logged_epoch(cfg.run_dir or default_run_dir(cfg.data_task(), cfg.model, cfg.train))


__all__ = ["ALIASES", "DESCRIPTION", "TASK_NAMES", "command_config_class", "interrupted_at", "parse", "run_config"]
