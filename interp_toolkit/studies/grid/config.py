"""The sweep config of an MPSP study (:class:`SweepConfig`), its presets, and the configs of
every run of its grid (:func:`cell_configs`, keyed into run directory names by
:func:`run_dir_name`).

A :class:`SweepConfig` nests the settings every run shares by the config they belong to, each
a typed :class:`Section` of that config: ``task`` (``Section[MPSPConfig]``, fields of
:class:`~interp_toolkit.tasks.mpsp.MPSPConfig`), ``model`` (``Section[ModelConfig]``,
:class:`~interp_toolkit.model.ModelConfig`) and ``train`` (``Section[TrainConfig]``,
:class:`~interp_toolkit.runs.config.TrainConfig`), beside the grid: its cell axes
(``tasks``, ``ratios``, ``n_layers``, ``n_heads``, ``weight_decays``, ``seeds``) and
``grid``, more axes over any section field (``{"train.batch_size": [256, None]}``). So a new
field of one of those configs is a sweep setting, a grid axis and (see
:mod:`interp_toolkit.studies.grid.cells`) a cell key with no edit here. The flat names of earlier
versions (``seq_len``, ``lr``, ``batch_size``, ...: :data:`FLAT_NAMES`) stay as the short
names: keys of config files and study records (:func:`nested_settings` converts them) and
flags; in Python a setting is read from its section (``cfg.train.lr``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Literal, Mapping, TypeVar, Union

from interp_toolkit.config import Config, _plain
from interp_toolkit.errors import UserError
from interp_toolkit.io import config_hash
from interp_toolkit.model import ModelConfig
from interp_toolkit.runs.config import TrainConfig
from interp_toolkit.tasks.mpsp import MPSPConfig

#: The config class a :class:`Section` is part of.
S = TypeVar("S")

#: SweepConfig fields that do not change results (beyond float rounding): not in its key.
NOT_IN_KEY = ("device",)
#: TrainConfig fields that choose how, not what, to compute: not in run directory names,
#: nor in a study's key.
HOW_NOT_WHAT = ("engine", "device")

#: A ratio entry meaning "r = 1/m of each task" (0.5 for parity tasks, 1/3 for mod-3 tasks).
CHANCE = "chance"

#: SweepConfig fields that only score runs (they are re-applied by ``report`` to stored
#: metrics), so they are left out of the study key: changing them never retrains.
OUTCOME_ONLY_FIELDS = ("transient_tolerance", "transient_min_span")

#: SweepConfig fields that only choose which runs exist (or how seeds are batched), not how
#: any run trains: a study directory accepts a sweep that differs from its own only in these,
#: so a study grows by more seeds, ratios or architectures in place (runs are keyed by their
#: own configs and the report pools them by cell).
GRID_FIELDS = ("tasks", "ratios", "n_layers", "n_heads", "weight_decays", "seeds", "seeds_per_process", "grid")

#: The nested configs of a sweep, by section name (see :meth:`SweepConfig.config_classes`).
SECTIONS = ("task", "model", "train")
#: Section fields a sweep sets for each run (from its cell, its seed and its task), never
#: from the section: the task's label, shortcut and r; the model's layers, heads, seed and
#: vocabulary sizes; the weight decay, and the trainer's progress bar and device.
PER_RUN = {"task": ("label", "shortcut", "r"),
           "model": ("n_layers", "n_heads", "seed", "d_vocab", "n_ctx", "d_vocab_out"),
           "train": ("weight_decay", "progress", "device")}
#: The flat names of section fields (SweepConfig fields of earlier versions): the short names
#: config files, study records and flags accept, and the names run keys hash (:meth:`SweepConfig.flat_dict`).
FLAT_NAMES = {"seq_len": ("task", "seq_len"), "n_values": ("task", "n_values"), "n_train": ("task", "n_train"),
              "n_eval": ("task", "n_eval"), "data_seed": ("task", "seed"), "d_model": ("model", "d_model"),
              "d_mlp": ("model", "d_mlp"), "epochs": ("train", "epochs"), "lr": ("train", "lr"),
              "betas": ("train", "betas"), "batch_size": ("train", "batch_size"),
              "eval_every": ("train", "eval_every"), "checkpoint_every": ("train", "checkpoint_every"),
              "checkpoint_log_spaced": ("train", "checkpoint_log_spaced")}
#: Where a sweep's section values differ from their config's defaults.
SECTION_DEFAULTS: dict[str, dict[str, Any]] = {"task": {}, "model": {}, "train": {"checkpoint_every": 500}}


class Section(Mapping[str, Any], Generic[S]):
    """The settings every run of a sweep shares in one of its configs: the fields of
    ``config_class`` except those the sweep sets per run (:data:`PER_RUN`), each given or at
    its default (the config's, or the sweep's own: :data:`SECTION_DEFAULTS`).

    A section reads like the mapping it is written as in config files (``section["lr"]``),
    and like the config it is part of (``section.lr``); :meth:`build` makes that config for one
    run from the section and the run's own fields, typed as ``config_class``.

    Raises:
        UserError: A field the config lacks, or one the sweep sets per run (named, with the
            sweep field to use instead).
    """

    def __init__(self, name: str, config_class: type[S], given: Mapping[str, Any] | None = None) -> None:
        if given is not None and not isinstance(given, Mapping):
            raise UserError(f"SweepConfig.{name} must be a mapping of its config's fields, got {given!r}")
        given = dict(given or {})
        for key in given:
            if key in PER_RUN[name]:
                axis = {"r": "ratios", "n_layers": "n_layers", "n_heads": "n_heads", "seed": "seeds",
                        "weight_decay": "weight_decays", "label": "tasks", "shortcut": "tasks"}.get(key)
                where = f"set {axis} instead" if axis else "the sweep sets it for each run"
                raise UserError(f"SweepConfig.{name}.{key} is set per run ({where}); got {given[key]!r}")
        defaults = section_fields(name, config_class)
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise UserError(f"unknown {config_class.__name__} keys {unknown} in SweepConfig.{name}; expected a "
                            f"subset of {sorted(defaults)}")
        values = {**defaults, **{key: _plain(value) for key, value in given.items()}}
        if name == "train" and isinstance(values.get("betas"), list):
            values["betas"] = [float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) else b
                               for b in values["betas"]]
        self.__dict__.update(_name=name, _class=config_class, _values=values)

    @property
    def config_class(self) -> type[S]:
        """The config this section is part of."""
        return self.__dict__["_class"]

    def __getitem__(self, key: str) -> Any:
        return self.__dict__["_values"][key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dict__["_values"])

    def __len__(self) -> int:
        return len(self.__dict__["_values"])

    def __getattr__(self, key: str) -> Any:
        values = self.__dict__.get("_values", {})
        if key in values:
            return values[key]
        raise AttributeError(f"SweepConfig.{self.__dict__.get('_name', '?')} has no setting {key!r}")

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a sweep section is read-only; use SweepConfig.replace({self.__dict__['_name']}="
                             f"{{{key!r}: ...}})")

    def __repr__(self) -> str:
        return f"Section[{self.config_class.__name__}]({self.__dict__['_values']!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled to sweep workers
        return (Section, (self.__dict__["_name"], self.__dict__["_class"], self.__dict__["_values"]))

    def to_dict(self) -> dict[str, Any]:
        """The section's settings as plain JSON-able values (what study records store)."""
        return dict(self.__dict__["_values"])

    def build(self, **per_run: Any) -> S:
        """``config_class`` of one run: this section's settings, then ``per_run`` (the run's
        own fields and any grid axis of this section)."""
        return self.config_class(**{**self.__dict__["_values"], **per_run})


def section_fields(section: str, config_class: type) -> dict[str, Any]:
    """Every field a sweep may set in ``section`` of ``config_class`` with its default (the
    config's, or the sweep's own: :data:`SECTION_DEFAULTS`)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.name in PER_RUN[section]:
            continue
        if f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
        elif f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
    return {**out, **SECTION_DEFAULTS[section]}


def _merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``update``, the sections (and ``grid``) merged key by key."""
    out = dict(base)
    for key, value in update.items():
        if key in (*SECTIONS, "grid") and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def nested_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep's settings with flat names (``lr``, ``seq_len``, ...: :data:`FLAT_NAMES`) and
    dotted names (``"train.lr"``) moved into their sections, as :class:`SweepConfig` takes them.

    Config files and study records written before the sections existed are flat; this
    converts them. A setting given twice with different values is refused.

    Raises:
        UserError: a section that is not a mapping, or one setting given twice with two values.
    """
    if not isinstance(data, Mapping):
        raise UserError(f"SweepConfig must be given as a mapping of its fields, got {type(data).__name__}")
    out: dict[str, Any] = {}
    moved: list[tuple[str, str, str, Any]] = []
    for key, value in data.items():
        if key in FLAT_NAMES:
            moved.append((key, *FLAT_NAMES[key], value))
        elif isinstance(key, str) and key.partition(".")[0] in SECTIONS and "." in key:
            section, _, name = key.partition(".")
            moved.append((key, section, name, value))
        else:
            out[key] = value
    for section in SECTIONS:
        if section in out:
            if not isinstance(out[section], Mapping):
                raise UserError(f"SweepConfig.{section} must be a mapping of its config's fields, got {out[section]!r}")
            out[section] = dict(out[section])
    for key, section, name, value in moved:
        fields = out.setdefault(section, {})
        if name in fields and _plain(fields[name]) != _plain(value):
            raise UserError(f"SweepConfig: {key}={value!r} and {section}.{name}={fields[name]!r} disagree; "
                            "give the setting once")
        fields[name] = value
    return out


@dataclass
class SweepConfig(Config):
    """Validated grid of an MPSP study.

    Cells are the product ``tasks x ratios x n_layers x n_heads x weight_decays`` (x every
    axis of ``grid``); every cell is trained with every seed in ``seeds`` (the
    model-initialization seed; the data of a cell is fixed by the task's ``seed``, so seeds
    measure initialization variance).

    Attributes:
        name: Readable study name (used in the default study directory).
        tasks: MPSP task names (``interp_toolkit.tasks.mpsp.TASKS``).
        ratios: Training spurious ratios r, each in [0, 1], or ``"chance"`` for r = 1/m of
            each task (m = 2 for parity tasks, 3 for mod-3 tasks; a duplicate is dropped).
        n_layers: Layer counts.
        n_heads: Head counts.
        weight_decays: AdamW weight decays.
        seeds: Model seeds (an int n means ``0 .. n-1``).
        task: ``MPSPConfig`` fields every cell shares (``seq_len``, ``n_values``, ``n_train``,
            ``n_eval``, ``seed``: the data seed); label, shortcut and r come from the grid.
            Given as a mapping, held as a :class:`Section` completed with the config's defaults.
        model: ``ModelConfig`` fields every cell shares (``d_model``, ``d_mlp``, ``act_fn``,
            ...); layers, heads, seed and vocabulary sizes come from the grid and the task.
        train: ``TrainConfig`` fields every cell shares (``epochs``, ``lr``, ``betas``,
            ``batch_size``, ``eval_every``, ``checkpoint_every`` (default 500),
            ``checkpoint_log_spaced``, ...); the weight decay comes from ``weight_decays``.
        grid: More grid axes: ``"SECTION.FIELD"`` -> the values to sweep (e.g.
            ``{"train.batch_size": [256, None]}``); each becomes a cell setting of its own.
        early_stop: Stop a run once it has generalized (saves time; hides transience).
        data_seeds: ``"fixed"``: every run trains on the data of ``task.seed`` (one dataset;
            grid over it with ``grid={"task.seed": [...]}``); ``"model"``: each run's data
            seed is its model seed, so every seed is a fresh model on a fresh dataset.
        seeds_per_process: At most this many seeds of one cell are trained together in one
            job (``None``: chosen from the resources, see
            :func:`interp_toolkit.studies.sweep.resources.seeds_per_job`).
        threshold: Accuracy that counts as 100% (generalized on the generalization split,
            rule learned on both; see ``interp_toolkit.studies.common.outcomes``).
        transient_tolerance: A generalized run whose generalization-split accuracy falls
            below this ...
        transient_min_span: ... for at least this many consecutive evaluations is transient.
        device: Where runs train: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA if
            the worker has it), resolved on each worker. On a GPU every seed of a cell trains
            in one job (the engine splits the batch into passes that fit the GPU's memory) and
            Ray tasks ask for a share of one GPU. Not part of the study's key: results agree
            up to float rounding.
    """

    name: str = "mpsp"
    tasks: list[str] = field(default_factory=lambda: ["max_parity_sum_parity"])
    ratios: list[Union[float, Literal["chance"]]] = field(default_factory=lambda: [0.5, 0.9])  # noqa: UP007
    n_layers: list[int] = field(default_factory=lambda: [1, 2])
    n_heads: list[int] = field(default_factory=lambda: [2])
    weight_decays: list[float] = field(default_factory=lambda: [0.1])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    # given as mappings (config files, from_dict), held as sections (__post_init__)
    task: Section[MPSPConfig] = field(default_factory=dict)  # type: ignore[arg-type]
    model: Section[ModelConfig] = field(default_factory=dict)  # type: ignore[arg-type]
    train: Section[TrainConfig] = field(default_factory=dict)  # type: ignore[arg-type]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    early_stop: bool = False
    seeds_per_process: int | None = None
    threshold: float = 1.0
    transient_tolerance: float = 0.99
    transient_min_span: int = 3
    device: str = "auto"
    data_seeds: str = "fixed"

    @classmethod
    def config_classes(cls) -> dict[str, Any]:
        """The config class of each section (a subclass may return subclasses, e.g. a
        ``TrainConfig`` with a field of its own: it is then a setting of every sweep)."""
        return {"task": MPSPConfig, "model": ModelConfig, "train": TrainConfig}

    @classmethod
    def section_defaults(cls, section: str) -> dict[str, Any]:
        """Every field a sweep may set in ``section`` with its default (the config's default,
        or the sweep's own: :data:`SECTION_DEFAULTS`)."""
        return section_fields(section, cls.config_classes()[section])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepConfig:
        """Build from a dict with sections, flat names (earlier versions) or both
        (:func:`nested_settings`), rejecting unknown keys by name."""
        data = nested_settings(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown SweepConfig keys {unknown}; expected a subset of {sorted(known)}, a flat name "
                            f"({', '.join(FLAT_NAMES)}) or SECTION.FIELD with SECTION in {', '.join(SECTIONS)}")
        return super().from_dict(data)

    def replace(self, **changes: Any) -> SweepConfig:
        """A copy with ``changes`` applied (flat, dotted or section names; validated again)."""
        return type(self).from_dict(_merge(self.to_dict(), nested_settings(changes)))

    def _check_grid(self) -> None:
        if not isinstance(self.grid, Mapping):
            raise UserError(f"SweepConfig.grid must map 'SECTION.FIELD' to lists of values, got {self.grid!r}")
        grid = {}
        for axis, values in self.grid.items():
            section, _, name = str(axis).partition(".")
            if section not in SECTIONS or name not in self.section_defaults(section):
                raise UserError(f"SweepConfig.grid axis {axis!r} is not SECTION.FIELD with SECTION in {SECTIONS} and "
                                "FIELD a setting of its config (the cell axes tasks, ratios, n_layers, n_heads, "
                                "weight_decays, seeds are SweepConfig fields)")
            if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
                raise UserError(f"SweepConfig.grid[{axis!r}] must be a non-empty list, got {values!r}")
            values = [_plain(v) for v in values]
            if any(values.count(v) > 1 for v in values):
                raise UserError(f"SweepConfig.grid[{axis!r}] has duplicates: {values!r}")
            grid[str(axis)] = values
        self.grid = grid

    def __post_init__(self) -> None:
        from interp_toolkit.devices import check_device_name

        check_device_name(self.device)
        if self.data_seeds not in ("fixed", "model"):
            raise UserError(f"SweepConfig.data_seeds must be 'fixed' or 'model', got {self.data_seeds!r}")
        grid = getattr(self, "grid", None) or {}
        # (the task section is completed with the defaults on the way to a worker: only a seed
        # other than the default's is a conflict)
        if self.data_seeds == "model" and ("task.seed" in grid or (isinstance(self.task, Mapping)
                                                                   and self.task.get("seed", 0) != 0)):
            raise UserError("SweepConfig.data_seeds 'model' ties each run's data seed to its model seed; "
                             "task.seed (or a grid over it) would be overridden: give one of them")
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            if self.seeds < 1:
                raise UserError(f"SweepConfig.seeds must be a positive count or a list of ints, got {self.seeds!r}")
            self.seeds = list(range(self.seeds))
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise UserError(f"SweepConfig.name must be a non-empty string without '/', got {self.name!r}")
        for name in ("tasks", "n_layers", "n_heads", "weight_decays", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
                raise UserError(f"SweepConfig.{name} must be a non-empty list, got {value!r}")
            if len(set(value)) != len(value):
                raise UserError(f"SweepConfig.{name} has duplicates: {list(value)!r}")
            setattr(self, name, list(value))
        if isinstance(self.ratios, (str, bytes)) or not isinstance(self.ratios, (list, tuple)) or not self.ratios:
            raise UserError(f"SweepConfig.ratios must be a non-empty list, got {self.ratios!r}")
        for item in self.ratios:
            if item != CHANCE and (isinstance(item, bool) or not isinstance(item, (int, float))
                                   or not 0.0 <= item <= 1.0):
                raise UserError(f"SweepConfig.ratios must hold numbers in [0, 1] or {CHANCE!r}, got {item!r}")
        if len(set(self.ratios)) != len(self.ratios):
            raise UserError(f"SweepConfig.ratios has duplicates: {list(self.ratios)!r}")
        self.ratios = list(self.ratios)
        for name in ("n_layers", "n_heads", "seeds"):
            for item in getattr(self, name):
                if isinstance(item, bool) or not isinstance(item, int) or (name != "seeds" and item < 1):
                    raise UserError(f"SweepConfig.{name} must hold positive integers (seeds: integers), got {item!r}")
        for wd in self.weight_decays:
            if isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd < 0:
                raise UserError(f"SweepConfig.weight_decays must hold numbers >= 0, got {wd!r}")
        if self.seeds_per_process is not None and (
            isinstance(self.seeds_per_process, bool) or not isinstance(self.seeds_per_process, int)
            or self.seeds_per_process < 1
        ):
            raise UserError("SweepConfig.seeds_per_process must be a positive integer or None, got "
                            f"{self.seeds_per_process!r}")
        if not isinstance(self.early_stop, bool):
            raise UserError(f"SweepConfig.early_stop must be a bool, got {self.early_stop!r}")
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 1):
            raise UserError(f"SweepConfig.threshold must be in (0, 1], got {self.threshold!r}")
        self.outcome_thresholds()  # validates threshold and the transience settings by name
        classes = self.config_classes()
        for section in SECTIONS:
            given = getattr(self, section)
            if isinstance(given, Section) and given.config_class is classes[section]:
                continue
            setattr(self, section, Section(section, classes[section], given))
        self._check_grid()
        # Build every cell's configs once: their validation names the bad value.
        for cell in self.cells():
            cell_configs(self, cell, self.seeds[0])

    def task_ratios(self, task: str) -> list[float]:
        """The ratios of one task, ``"chance"`` resolved to its 1/m (duplicates dropped)."""
        from interp_toolkit.tasks.mpsp import task_modulus

        out: list[float] = []
        for item in self.ratios:
            r = 1.0 / task_modulus(task) if item == CHANCE else float(item)
            if not any(abs(r - seen) < 1e-9 for seen in out):
                out.append(r)
        return out

    def cells(self) -> list[dict[str, Any]]:
        """Every grid cell as ``{task, r, n_layers, n_heads, weight_decay}`` plus one
        ``"SECTION.FIELD"`` entry per axis of ``grid``."""
        axes = list(self.grid)
        return [
            {"task": task, "r": r, "n_layers": layers, "n_heads": heads, "weight_decay": float(wd),
             **dict(zip(axes, extra, strict=True))}
            for task in self.tasks
            for r, layers, heads, wd in itertools.product(
                self.task_ratios(task), self.n_layers, self.n_heads, self.weight_decays)
            for extra in itertools.product(*(self.grid[axis] for axis in axes))
        ]

    def outcome_thresholds(self) -> Any:
        """The :class:`~interp_toolkit.studies.common.outcomes.OutcomeThresholds` of this study."""
        from interp_toolkit.studies.common.outcomes import OutcomeThresholds

        return OutcomeThresholds(threshold=self.threshold, transient_tolerance=self.transient_tolerance,
                                 transient_min_span=self.transient_min_span)

    def flat_dict(self) -> dict[str, Any]:
        """Every setting under one name: the flat names of earlier versions for the fields
        they had (:data:`FLAT_NAMES`), ``"SECTION.FIELD"`` for any other section field that
        differs from its default (how-not-what fields left out), and ``grid`` when it has axes.

        For a sweep of earlier versions' settings this is that version's ``to_dict()``: the
        study keys (:meth:`key`, :meth:`study_key`) hash it, so they are unchanged.
        """
        plain = self.to_dict()
        out = {name: plain[name] for name in ("name", "tasks", "ratios", "n_layers", "n_heads", "weight_decays",
                                              "seeds")}
        out.update({flat: plain[section][name] for flat, (section, name) in FLAT_NAMES.items()})
        out.update({name: plain[name] for name in ("early_stop", "seeds_per_process", "threshold",
                                                   "transient_tolerance", "transient_min_span", "device")})
        flat_fields = set(FLAT_NAMES.values())
        for section in SECTIONS:
            defaults = self.section_defaults(section)
            for name, value in plain[section].items():
                if (section, name) in flat_fields or (section == "train" and name in HOW_NOT_WHAT):
                    continue
                if value != defaults.get(name):
                    out[f"{section}.{name}"] = value
        if plain["grid"]:
            out["grid"] = plain["grid"]
        if plain.get("data_seeds", "fixed") != "fixed":  # added later: earlier studies keep their keys
            out["data_seeds"] = plain["data_seeds"]
        return out

    def key(self) -> str:
        """Hash of everything that decides the study's training (not the outcome-only fields,
        nor where it runs)."""
        data = {k: v for k, v in self.flat_dict().items() if k not in OUTCOME_ONLY_FIELDS + NOT_IN_KEY}
        return config_hash(data, 8)

    def study_key(self) -> str:
        """Hash of the settings a study shares across its grid: :meth:`key` without the
        ``GRID_FIELDS``. Sweeps that differ only in their grid (more seeds, ratios, ...) have
        the same study key, so they share a default study directory and grow it in place."""
        skip = OUTCOME_ONLY_FIELDS + NOT_IN_KEY + GRID_FIELDS
        return config_hash({k: v for k, v in self.flat_dict().items() if k not in skip}, 8)

    def n_runs(self) -> int:
        return len(self.cells()) * len(self.seeds)


#: Presets (flat names, as config files of earlier versions). ``smoke``: ~1 minute on 2 CPU
#: cores, for tests. ``quick``: a small but real study on one laptop in ~15 minutes on 2 CPU
#: cores (see PRESET_NOTES). ``reproduce``: the regime chosen by the calibration study of
#: docs/reproduction.md. ``paper``: the paper's protocol where the paper states it, this
#: project's choices elsewhere (lr, betas, full batch, length, values, LayerNorm / ReLU /
#: learned positions; see PRESET_NOTES; cluster / GPU scale).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        name="smoke", ratios=[0.5, 0.9], n_layers=[1], n_heads=[2], weight_decays=[0.1], seeds=[0, 1], seq_len=5,
        n_train=256, n_eval=128, d_model=32, d_mlp=64, epochs=40, lr=3e-3, eval_every=10, checkpoint_every=20,
        checkpoint_log_spaced=False,
    ),
    "quick": dict(
        name="quick", ratios=[0.5, 0.9], n_layers=[1, 2], n_heads=[2], weight_decays=[0.1], seeds=4, seq_len=5,
        n_train=4096, n_eval=512, d_model=64, d_mlp=128, epochs=300, lr=1e-3, eval_every=20, checkpoint_every=100,
    ),
    "reproduce": dict(
        name="reproduce", tasks=["max_parity_sum_parity"], ratios=[0.9, 0.5, 0.1, 0.3, 0.7], n_layers=[2, 1],
        n_heads=[2], weight_decays=[0.1, 0.4], seeds=list(range(100, 116)), seq_len=8, n_values=10, n_train=16_384,
        n_eval=2_048, d_model=64, d_mlp=128, epochs=1_000, lr=1e-3, eval_every=10, checkpoint_every=250,
        checkpoint_log_spaced=True, early_stop=True, seeds_per_process=4, threshold=1.0,
    ),
    "paper": dict(
        name="paper",
        tasks=["max_parity_sum_parity", "first_parity_sum_parity", "max_mod3_sum_mod3", "first_mod3_sum_mod3"],
        ratios=[0.1, 0.3, CHANCE, 0.5, 0.7, 0.9], n_layers=[1, 2], n_heads=[1, 2], weight_decays=[0.1, 0.4], seeds=30,
        seq_len=10, n_train=16_384, n_eval=2_048, d_model=64, d_mlp=128, epochs=15_000, lr=1e-3, eval_every=50,
        checkpoint_every=1_000, early_stop=False, threshold=1.0, transient_tolerance=0.99, transient_min_span=3,
    ),
}


PRESET_NOTES = {
    "smoke": "2 cells x 2 seeds, 256 examples of length 5, d_model 32, 40 epochs: exercises "
             "every stage (batched training, resume, outcomes, report) in about a minute.",
    "quick": "r in {0.5, 0.9} x 1L/2L x 2 heads x 4 seeds = 16 runs, 4,096 examples of length 5, "
             "d_model 64, lr 1e-3, 300 epochs: ~15 min on 2 CPU cores. The smallest setting in "
             "which a calibration run here learned the true rule at all (an earlier 768-example, "
             "lr 3e-3 preset only memorized); not the paper's numbers.",
    "reproduce": "The reproduction regime of docs/reproduction.md: sum parity / max shortcut, length 8, "
                 "values 0..9, 16,384 examples; the paper's widths (d_model 64, d_mlp 128) and optimizer "
                 "(AdamW); lr 1e-3, betas (0.9, 0.98), full batch, length and values are this project's "
                 "choices (the paper states none of them); 16 seeds per cell (100-115: fresh, "
                 "apart from the calibration's 0-3), r in "
                 "{0.9, 0.5 (= 1/m), 0.1, 0.3, 0.7} (headline cells first) x 2L/1L x wd 0.1 and 0.4, 1,000 "
                 "epochs (1/15 of the paper's), a run stopped once it has generalized (so its wd 0.4 cells cannot "
                 "show transience: examples/reproduction/final_1L_wd04.yaml trains them without early stop). "
                 "320 runs: ~65 core-hours "
                 "on these CPUs (2L ~1.3 s, 1L ~0.2 s per seed-epoch); resumable across invocations.",
    "paper": "The paper where it is stated, this project's choices elsewhere. Stated by the paper: the "
             "four task variants, 16,384 examples, r in {0.1, 0.3, 1/m, 0.5, 0.7, 0.9} (1/m per task), "
             "1L/2L x 1/2 heads, d_model 64, d_mlp 128, AdamW with wd 0.1 and 0.4, 15,000 epochs, 30 seeds, "
             "the 100% criterion. This project's choices (not stated by the paper): lr 1e-3, betas (0.9, "
             "0.98), full batch, sequence length 10, values 0..9, LayerNorm / ReLU / learned positions (the "
             "model's defaults), no early stop, transient below 0.99 for >= 3 evaluations.",
}

def preset(name: str, **overrides: Any) -> SweepConfig:
    """The ``SweepConfig`` of a named preset, with settings overridden by keyword (flat names
    such as ``epochs=10``, dotted ones such as ``**{"train.lr": 3e-3}``, or sections)."""
    if name not in PRESETS:
        raise UserError(f"unknown sweep preset {name!r}; expected one of {sorted(PRESETS)}")
    return SweepConfig.from_dict(_merge(nested_settings(PRESETS[name]), nested_settings(overrides)))


def cell_configs(cfg: SweepConfig, cell: Mapping[str, Any], seed: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(task_cfg, model_cfg, train_cfg, run_info)`` of one run of the sweep: the sections'
    settings, the cell's (its ``"SECTION.FIELD"`` axes included) and the seed."""
    axes: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}  # the cell's SECTION.FIELD axes
    for axis, value in cell.items():
        section, dot, name = axis.partition(".")
        if dot:
            axes[section][name] = value
    if cfg.data_seeds == "model":  # a fresh dataset per seed
        axes["task"]["seed"] = seed
    task_cfg = cfg.task.config_class.from_task(cell["task"], **{**cfg.task, **axes["task"]}, r=cell["r"])
    model_cfg = cfg.model.build(n_layers=cell["n_layers"], n_heads=cell["n_heads"], seed=seed, **axes["model"],
                                **task_cfg.model_dims())
    train_cfg = cfg.train.build(**axes["train"], weight_decay=cell["weight_decay"], progress=False)
    run_info: dict[str, Any] = {"task": {"name": task_cfg.name, **task_cfg.to_dict()}}
    if cfg.early_stop:
        # The rule's name is part of the run key: runs stopped under the older, stricter rule
        # (both splits at 100%) are not mistaken for these.
        run_info["early_stop"] = {"rule": "generalized_paper_criterion", "threshold": cfg.threshold}
    return task_cfg, model_cfg, train_cfg, run_info


def run_dir_name(cell: Mapping[str, Any], seed: int, task_cfg: Any, model_cfg: Any, train_cfg: Any,
                 run_info: Mapping[str, Any]) -> str:
    """Readable name plus a hash of every config: distinct runs, distinct directories."""
    train = {k: v for k, v in train_cfg.to_dict().items() if k not in HOW_NOT_WHAT}
    key = config_hash({"task": task_cfg.to_dict(), "model": model_cfg.to_dict(),
                       "train": train, "info": dict(run_info)}, 8)
    return (f"{cell['task']}_{cell['n_layers']}L{cell['n_heads']}H_r{cell['r']:g}_wd{cell['weight_decay']:g}"
            f"_s{seed}_{key}")


def stop_rule_of(cfg: SweepConfig, cell: Mapping[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """The early stop of a cell's runs: stop once generalized (the paper's criterion at
    ``cfg.threshold``) when ``cfg.early_stop``, else None."""
    from interp_toolkit.studies.common.outcomes import generalization_stop_rule
    from interp_toolkit.tasks.mpsp import task_modulus

    return generalization_stop_rule(cell["r"], task_modulus(cell["task"]), cfg.threshold) if cfg.early_stop else None


__all__ = ["CHANCE", "FLAT_NAMES", "GRID_FIELDS", "HOW_NOT_WHAT", "NOT_IN_KEY",
           "OUTCOME_ONLY_FIELDS", "PER_RUN", "PRESETS", "PRESET_NOTES", "SECTIONS",
           "SECTION_DEFAULTS", "Section", "SweepConfig", "cell_configs", "nested_settings", "preset",
           "run_dir_name", "section_fields", "stop_rule_of"]
