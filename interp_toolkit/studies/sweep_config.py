"""The sweep config of an MPSP study (:class:`SweepConfig`), its presets, and the configs of
every run of its grid (:func:`cell_configs`, keyed into run directory names by
:func:`run_dir_name`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Union

from interp_toolkit.config import Config
from interp_toolkit.io import config_hash

#: SweepConfig fields that do not change results (beyond float rounding): not in its key.
NOT_IN_KEY = ("device",)


#: TrainConfig fields that choose how, not what, to compute: not in run directory names.
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
GRID_FIELDS = ("tasks", "ratios", "n_layers", "n_heads", "weight_decays", "seeds", "seeds_per_process")


@dataclass
class SweepConfig(Config):
    """Validated grid of an MPSP study.

    Cells are the product ``tasks x ratios x n_layers x n_heads x weight_decays``; every
    cell is trained with every seed in ``seeds`` (the model-initialization seed; the data
    of a cell is fixed by ``data_seed``, so seeds measure initialization variance).

    Attributes:
        name: Readable study name (used in the default study directory).
        tasks: MPSP task names (``interp_toolkit.tasks.mpsp.TASKS``).
        ratios: Training spurious ratios r, each in [0, 1], or ``"chance"`` for r = 1/m of
            each task (m = 2 for parity tasks, 3 for mod-3 tasks; a duplicate is dropped).
        n_layers: Layer counts.
        n_heads: Head counts.
        weight_decays: AdamW weight decays.
        seeds: Model seeds (an int n means ``0 .. n-1``).
        seq_len, n_values, n_train, n_eval, data_seed: Task settings shared by all cells.
        d_model, d_mlp: Model widths.
        epochs, lr, betas, batch_size, eval_every, checkpoint_every, checkpoint_log_spaced:
            Training settings (see ``TrainConfig``).
        early_stop: Stop a run once it has generalized (saves time; hides transience).
        seeds_per_process: At most this many seeds of one cell are trained together in one
            job (``None``: all of them).
        threshold: Accuracy that counts as 100% (generalized on the generalization split,
            rule learned on both; see ``interp_toolkit.studies.outcomes``).
        transient_tolerance: A generalized run whose generalization-split accuracy falls
            below this ...
        transient_min_span: ... for at least this many consecutive evaluations is transient.
        device: Where runs train: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA if
            the worker has it). On a GPU every seed of a cell trains in one job (the engine
            splits the batch into passes that fit the GPU's memory) and Ray tasks ask for
            one GPU. Not part of the study's key: results agree up to float rounding.
    """

    name: str = "mpsp"
    tasks: list[str] = field(default_factory=lambda: ["max_parity_sum_parity"])
    ratios: list[Union[float, Literal["chance"]]] = field(default_factory=lambda: [0.5, 0.9])  # noqa: UP007
    n_layers: list[int] = field(default_factory=lambda: [1, 2])
    n_heads: list[int] = field(default_factory=lambda: [2])
    weight_decays: list[float] = field(default_factory=lambda: [0.1])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    seq_len: int = 10
    n_values: int = 10
    n_train: int = 16_384
    n_eval: int = 2_048
    data_seed: int = 0
    d_model: int = 64
    d_mlp: int = 128
    epochs: int = 2_000
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    batch_size: int | None = None
    eval_every: int = 10
    checkpoint_every: int | None = 500
    checkpoint_log_spaced: bool = True
    early_stop: bool = False
    seeds_per_process: int | None = None
    threshold: float = 1.0
    transient_tolerance: float = 0.99
    transient_min_span: int = 3
    device: str = "auto"

    def __post_init__(self) -> None:
        from interp_toolkit.devices import check_device_name

        check_device_name(self.device)
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            if self.seeds < 1:
                raise ValueError(f"SweepConfig.seeds must be a positive count or a list of ints, got {self.seeds!r}")
            self.seeds = list(range(self.seeds))
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"SweepConfig.name must be a non-empty string without '/', got {self.name!r}")
        for name in ("tasks", "n_layers", "n_heads", "weight_decays", "seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
                raise ValueError(f"SweepConfig.{name} must be a non-empty list, got {value!r}")
            if len(set(value)) != len(value):
                raise ValueError(f"SweepConfig.{name} has duplicates: {list(value)!r}")
            setattr(self, name, list(value))
        if isinstance(self.ratios, (str, bytes)) or not isinstance(self.ratios, (list, tuple)) or not self.ratios:
            raise ValueError(f"SweepConfig.ratios must be a non-empty list, got {self.ratios!r}")
        for item in self.ratios:
            if item != CHANCE and (isinstance(item, bool) or not isinstance(item, (int, float))
                                   or not 0.0 <= item <= 1.0):
                raise ValueError(f"SweepConfig.ratios must hold numbers in [0, 1] or {CHANCE!r}, got {item!r}")
        if len(set(self.ratios)) != len(self.ratios):
            raise ValueError(f"SweepConfig.ratios has duplicates: {list(self.ratios)!r}")
        self.ratios = list(self.ratios)
        for name in ("n_layers", "n_heads", "seeds"):
            for item in getattr(self, name):
                if isinstance(item, bool) or not isinstance(item, int) or (name != "seeds" and item < 1):
                    raise ValueError(f"SweepConfig.{name} must hold positive integers (seeds: integers), got {item!r}")
        for wd in self.weight_decays:
            if isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd < 0:
                raise ValueError(f"SweepConfig.weight_decays must hold numbers >= 0, got {wd!r}")
        if self.seeds_per_process is not None and (
            isinstance(self.seeds_per_process, bool) or not isinstance(self.seeds_per_process, int)
            or self.seeds_per_process < 1
        ):
            raise ValueError(f"SweepConfig.seeds_per_process must be a positive integer or None, got {self.seeds_per_process!r}")
        if not isinstance(self.early_stop, bool):
            raise ValueError(f"SweepConfig.early_stop must be a bool, got {self.early_stop!r}")
        if not (isinstance(self.threshold, (int, float)) and 0 < self.threshold <= 1):
            raise ValueError(f"SweepConfig.threshold must be in (0, 1], got {self.threshold!r}")
        self.outcome_thresholds()  # validates threshold and the transience settings by name
        self.betas = tuple(float(b) for b in self.betas)
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
        """Every grid cell as ``{task, r, n_layers, n_heads, weight_decay}``."""
        return [
            {"task": task, "r": r, "n_layers": layers, "n_heads": heads, "weight_decay": float(wd)}
            for task in self.tasks
            for r, layers, heads, wd in itertools.product(
                self.task_ratios(task), self.n_layers, self.n_heads, self.weight_decays)
        ]

    def outcome_thresholds(self) -> Any:
        """The :class:`~interp_toolkit.studies.outcomes.OutcomeThresholds` of this study."""
        from interp_toolkit.studies.outcomes import OutcomeThresholds

        return OutcomeThresholds(threshold=self.threshold, transient_tolerance=self.transient_tolerance,
                                 transient_min_span=self.transient_min_span)

    def key(self) -> str:
        """Hash of everything that decides the study's training (not the outcome-only fields,
        nor where it runs)."""
        data = {k: v for k, v in self.to_dict().items() if k not in OUTCOME_ONLY_FIELDS + NOT_IN_KEY}
        return config_hash(data, 8)

    def study_key(self) -> str:
        """Hash of the settings a study shares across its grid: :meth:`key` without the
        ``GRID_FIELDS``. Sweeps that differ only in their grid (more seeds, ratios, ...) have
        the same study key, so they share a default study directory and grow it in place."""
        skip = OUTCOME_ONLY_FIELDS + NOT_IN_KEY + GRID_FIELDS
        return config_hash({k: v for k, v in self.to_dict().items() if k not in skip}, 8)

    def n_runs(self) -> int:
        return len(self.cells()) * len(self.seeds)


#: Presets. ``smoke``: ~1 minute on 2 CPU cores, for tests. ``quick``: a small but real
#: study on one laptop in ~15 minutes on 2 CPU cores (see PRESET_NOTES).
#: ``reproduce``: the regime chosen by the calibration study of docs/reproduction.md.
#: ``paper``: the source protocol (cluster / GPU scale).
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        name="smoke", ratios=[0.5, 0.9], n_layers=[1], n_heads=[2], weight_decays=[0.1],
        seeds=[0, 1], seq_len=5, n_train=256, n_eval=128, d_model=32, d_mlp=64, epochs=40,
        lr=3e-3, eval_every=10, checkpoint_every=20, checkpoint_log_spaced=False,
    ),
    "quick": dict(
        name="quick", ratios=[0.5, 0.9], n_layers=[1, 2], n_heads=[2], weight_decays=[0.1],
        seeds=4, seq_len=5, n_train=4096, n_eval=512, d_model=64, d_mlp=128, epochs=300,
        lr=1e-3, eval_every=20, checkpoint_every=100,
    ),
    "reproduce": dict(
        name="reproduce", tasks=["max_parity_sum_parity"], ratios=[0.9, 0.5, 0.1, 0.3, 0.7], n_layers=[2, 1],
        n_heads=[2], weight_decays=[0.1, 0.4], seeds=list(range(100, 116)), seq_len=8, n_values=10, n_train=16_384, n_eval=2_048,
        d_model=64, d_mlp=128, epochs=1_000, lr=1e-3, eval_every=10, checkpoint_every=250,
        checkpoint_log_spaced=True, early_stop=True, seeds_per_process=4, threshold=1.0,
    ),
    "paper": dict(
        name="paper", tasks=["max_parity_sum_parity", "first_parity_sum_parity", "max_mod3_sum_mod3",
                             "first_mod3_sum_mod3"],
        ratios=[0.1, 0.3, CHANCE, 0.5, 0.7, 0.9], n_layers=[1, 2], n_heads=[1, 2],
        weight_decays=[0.1, 0.4], seeds=30, seq_len=10, n_train=16_384, n_eval=2_048,
        d_model=64, d_mlp=128, epochs=15_000, lr=1e-3, eval_every=50, checkpoint_every=1_000,
        early_stop=False, threshold=1.0, transient_tolerance=0.99, transient_min_span=3,
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
                 "values 0..9, 16,384 examples, the paper's widths and optimizer, 16 seeds per cell (100-115: fresh, "
                 "apart from the calibration's 0-3), r in "
                 "{0.9, 0.5 (= 1/m), 0.1, 0.3, 0.7} (headline cells first) x 2L/1L x wd 0.1 and 0.4, 1,000 "
                 "epochs (1/15 of the paper's), a run stopped once it has generalized (so its wd 0.4 cells cannot "
                 "show transience: examples/reproduction/final_1L_wd04.yaml trains them without early stop). "
                 "320 runs: ~65 core-hours "
                 "on these CPUs (2L ~1.3 s, 1L ~0.2 s per seed-epoch); resumable across sittings.",
    "paper": "The source protocol: the four task variants, 16,384 examples, r in {0.1, 0.3, 1/m, 0.5, "
             "0.7, 0.9} (1/m per task), 1L/2L x 1/2 heads, d_model 64, d_mlp 128, AdamW wd 0.1 and 0.4, "
             "15,000 epochs, 30 seeds, no early stop; outcome thresholds: 100%, transient below 0.99 for "
             ">= 3 evaluations.",
}


def preset(name: str, **overrides: Any) -> SweepConfig:
    """The ``SweepConfig`` of a named preset, with fields overridden by keyword."""
    if name not in PRESETS:
        raise ValueError(f"unknown sweep preset {name!r}; expected one of {sorted(PRESETS)}")
    return SweepConfig.from_dict({**PRESETS[name], **overrides})


def cell_configs(cfg: SweepConfig, cell: Mapping[str, Any], seed: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(task_cfg, model_cfg, train_cfg, run_info)`` of one run of the sweep."""
    from interp_toolkit.model import ModelConfig
    from interp_toolkit.runs.config import TrainConfig
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task_cfg = MPSPConfig.from_task(cell["task"], seq_len=cfg.seq_len, n_values=cfg.n_values, r=cell["r"],
                                    n_train=cfg.n_train, n_eval=cfg.n_eval, seed=cfg.data_seed)
    model_cfg = ModelConfig(n_layers=cell["n_layers"], n_heads=cell["n_heads"], d_model=cfg.d_model,
                            d_mlp=cfg.d_mlp, seed=seed, **task_cfg.model_dims())
    train_cfg = TrainConfig(epochs=cfg.epochs, lr=cfg.lr, betas=cfg.betas, weight_decay=cell["weight_decay"],
                            batch_size=cfg.batch_size, eval_every=cfg.eval_every,
                            checkpoint_every=cfg.checkpoint_every,
                            checkpoint_log_spaced=cfg.checkpoint_log_spaced, progress=False)
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
    from interp_toolkit.studies.outcomes import generalization_stop_rule
    from interp_toolkit.tasks.mpsp import task_modulus

    return generalization_stop_rule(cell["r"], task_modulus(cell["task"]), cfg.threshold) if cfg.early_stop else None


__all__ = ['CHANCE', 'GRID_FIELDS', 'HOW_NOT_WHAT', 'NOT_IN_KEY', 'OUTCOME_ONLY_FIELDS', 'PRESETS', 'PRESET_NOTES', 'SweepConfig', 'cell_configs', 'preset', 'run_dir_name', 'stop_rule_of']
