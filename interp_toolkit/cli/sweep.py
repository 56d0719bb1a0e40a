"""``interp-toolkit sweep``: a grid of MPSP cells x seeds, resumable and cached per run.

The study itself lives in :mod:`interp_toolkit.studies.sweep.run`. Flags are generated from the
configs (:func:`_sweep_flags`): the command's own options (:class:`SweepCommandConfig`),
``SweepConfig``'s grid and study settings (``--ratios 0.5 0.9``, ``--n-layers 1 2``,
``--early-stop`` ...), every field of its ``task``, ``model`` and ``train`` sections as
``--SECTION.FIELD`` (``--train.lr``, ``--train.seed``, ``--model.act-fn``: ``train``'s spelling;
the short flags of :data:`~interp_toolkit.cli.flags.SHORT_FLAGS`, ``--lr``, ``--epochs``,
``--seq-len`` ..., are the same in both commands) and ``--grid SECTION.FIELD=V1,V2``.
Settings come from a preset (``--preset``, default ``smoke`` unless ``--config`` is given),
then ``--config FILE`` (JSON/YAML of ``SweepConfig`` fields, or of command fields with a
``sweep`` section), then flags. With neither ``--preset`` nor ``--config``, ``--out DIR`` of
an existing study starts from the study itself (its ``study.json``: the latest settings over
its whole grid, and its invocations' ``--extend-from`` and ``--recorded`` paths), so
``interp-toolkit sweep --out DIR`` resumes a study with nothing else at hand. Earlier
Lists may also be comma-separated (``--ratios 0.1,0.5``), ``--layers``/``--heads`` are
``--n-layers``/``--n-heads``, and ``--seeds N`` is a count (seeds ``0..N-1``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from interp_toolkit.cli.flags import SHORT_FLAGS, short_flags_text
from interp_toolkit.config import Config, load_config_file, parse_config, split_config_flag
from interp_toolkit.errors import UserError
from interp_toolkit.studies.grid.config import (
    PRESET_NOTES,
    PRESETS,
    SECTIONS,
    SweepConfig,
    nested_settings,
)

DESCRIPTION = ("Run a grid of MPSP cells x seeds. Finished runs are reused, interrupted ones resume. "
               "Lists take space- or comma-separated values; --seeds N alone is a count (seeds 0..N-1), "
               "and one seed is --seeds N, with a trailing comma. "
               "Every field of the task, model and train sections is a flag --SECTION.FIELD, as in train; "
               "short flags: " + short_flags_text(SHORT_FLAGS) + ". "
               "Presets: " + "; ".join(f"{k}: {v.rstrip('.')}" for k, v in PRESET_NOTES.items()))
LIST_FLAGS = ("--tasks", "--ratios", "--n-layers", "--n-heads", "--weight-decays", "--seeds")
ALIASES = {"--layers": "--n-layers", "--heads": "--n-heads"}


@dataclass
class SweepCommandConfig(Config):
    """Settings of ``interp-toolkit sweep`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        preset: Start from a preset (default: smoke unless --config is given, or --out names
            an existing study, whose own record is the start then).
        out: Study directory (default runs/sweeps/<name>_<hash of the non-grid settings>, so a
            sweep grown by more seeds or ratios lands in the study it grows). With neither
            --preset nor --config, an existing study here supplies the settings: its latest
            ones over its whole grid, and its invocations' --extend-from and --recorded paths.
        backend: Local process pool or Ray.
        address: Ray cluster address (default: start a local Ray; on a cluster: auto, or
            HEAD_IP:6379). Every node must mount --out at the same path (checked first).
        workers: Local processes (default: CPU count; on GPUs: jobs_per_gpu per GPU).
        jobs_per_gpu: Jobs sharing one GPU (a Ray task asks for 1/N of one; the local pool
            runs N workers per GPU). Default: enough jobs that one step of them all is about
            1 TFLOP (docs/sweeps.md, "Job sizing").
        retries: Times a job whose worker (or Ray node) died is run again (it resumes its runs).
        dry_run: Print the grid, its study directory and what a run would do (runs finished
            there, finished in recorded outcomes, to resume, to extend, to start), then exit.
            It also says where a study spread over several invocations stands: the process running a
            sweep on it now, and each run with a directory there (finished and generalized
            or not, running, or the epoch it resumes from; its last evaluation), and the
            expected cost: jobs, hours per job, core-hours on CPUs and GPU-hours on GPUs.
        quiet: No progress bar.
        log_every: Print a plain progress line to stderr at most every this many seconds (runs
            done, evaluations, time elapsed and at most left): for logs of background sweeps.
        tensorboard: Write TensorBoard event files into every run directory.
        wandb: Log every run to Weights & Biases (offline: under each run directory, no network).
        wandb_project: W&B project of the runs (with --wandb).
        wandb_entity: W&B entity (team or user); unset: your default entity.
        wandb_group: W&B group of the runs; unset: the study directory's name, so a study's runs
            are one group.
        recorded: Outcome tables of earlier invocations (outcomes.csv files, e.g.
            docs/reproduction/outcomes.csv): runs of this grid they list as finished are not
            trained again; the study's report includes them.
        extend_from: Study directories of this sweep at fewer epochs: a run not started here
            continues the same run there (from its final state) instead of training from epoch 0.
        state: A campaign's state folder (e.g. docs/reproduction/literal/state, committed): every
            run of the grid it holds further along is restored into the study directory first (a
            fresh machine continues it), and every run's compact state (record, metrics,
            checkpoints, resume state) is saved there at the end, with the session's cost in
            campaign.json and a status table in status.md. SIGTERM then pauses the runs at their
            epoch's end instead of interrupting them.
        budget: With --state: stop after this much wall time (2h30m, 90m, 45s, or seconds),
            every run paused at its epoch's end and saved; the next call continues them.
        status: With --state: print where every run of the campaign stands (epochs done, best
            adversarial accuracy, the epoch it met the criterion, core-hours left at the measured
            rate), write it to the state folder's status.md, and exit.
        sweep: The grid and the training settings of every run (its ``device``, ``--device``:
            cpu, cuda, cuda:N or auto, is checked before any work).
    """

    preset: Optional[str] = None  # noqa: UP007 - tyro reads the annotation at run time
    out: Optional[Path] = None  # noqa: UP007
    backend: Literal["local", "ray"] = "local"
    address: Optional[str] = None  # noqa: UP007
    workers: Optional[int] = None  # noqa: UP007
    jobs_per_gpu: Optional[int] = None  # noqa: UP007
    retries: int = 3
    dry_run: bool = False
    quiet: bool = False
    log_every: Optional[float] = None  # noqa: UP007
    tensorboard: bool = False
    wandb: Optional[Literal["offline", "online"]] = None  # noqa: UP007
    wandb_project: str = "interp-toolkit"
    wandb_entity: Optional[str] = None  # noqa: UP007
    wandb_group: Optional[str] = None  # noqa: UP007
    recorded: list[Path] = field(default_factory=list)
    extend_from: list[Path] = field(default_factory=list)
    state: Optional[Path] = None  # noqa: UP007
    budget: Optional[str] = None  # noqa: UP007
    status: bool = False
    sweep: SweepConfig = field(default_factory=lambda: SweepConfig.from_dict(PRESETS["smoke"]))

    def __post_init__(self) -> None:
        self.check("preset", self.preset is None or self.preset in PRESETS, f"one of {sorted(PRESETS)}")
        self.check("workers", self.workers is None or (isinstance(self.workers, int) and self.workers >= 1),
                   "an integer >= 1 or None")
        self.check("jobs_per_gpu", self.jobs_per_gpu is None or (
            isinstance(self.jobs_per_gpu, int) and not isinstance(self.jobs_per_gpu, bool) and self.jobs_per_gpu >= 1),
            "an integer >= 1 or None")
        self.check("retries", isinstance(self.retries, int) and not isinstance(self.retries, bool)
                   and self.retries >= 0, "an integer >= 0")
        self.check("log_every", self.log_every is None or (not isinstance(self.log_every, bool)
                                                           and isinstance(self.log_every, (int, float))
                                                           and self.log_every > 0),
                   "a positive number of seconds or None")
        self.check("budget", self.budget is None or self.state is not None, "given with --state (a campaign)")
        self.check("status", not self.status or self.state is not None, "given with --state (a campaign)")
        if self.budget is not None:
            from interp_toolkit.studies.sweep.campaign import parse_duration

            parse_duration(self.budget)
        if isinstance(self.out, str):
            self.out = Path(self.out)
        if isinstance(self.state, str):
            self.state = Path(self.state)
        self.recorded = [Path(p) for p in self.recorded]
        self.extend_from = [Path(p) for p in self.extend_from]


def _expand_lists(argv: Sequence[str]) -> tuple[list[str], int | None]:
    """Comma lists -> separate values; ``--seeds N`` (one value, no comma) -> ``0 .. N-1``.

    Returns:
        ``(the expanded argv, N)``, with ``N`` ``None`` unless ``--seeds`` was given as a count.
    """
    out: list[str] = []
    seed_count: int | None = None
    items = [ALIASES.get(t, t) for t in argv]
    i = 0
    while i < len(items):
        token = items[i]
        out.append(token)
        i += 1
        if token not in LIST_FLAGS:
            continue
        values: list[str] = []
        while i < len(items) and not items[i].startswith("--"):
            values.extend(v for v in items[i].split(",") if v.strip())
            i += 1
        if token == "--seeds" and len(values) == 1 and i > 0 and "," not in items[i - 1]:
            try:
                count = int(values[0])
            except ValueError as err:
                raise UserError(f"--seeds must be a count or a list of integers, got {values[0]!r}") from err
            if count < 1:
                raise UserError(f"--seeds count must be >= 1, got {count}")
            values = [str(s) for s in range(count)]
            seed_count = count
        out.extend(values)
    return out, seed_count


def _check_seed_count(count: int | None, listed: Sequence[int], source: str) -> None:
    """Refuse ``--seeds N`` read as a count when ``N`` is itself one of the seeds that the config
    or study lists and the count would plan seeds it does not list: ``--seeds 480`` meant for a
    config of seeds 480-483 would otherwise start 480 runs per cell of seeds 0..479."""
    if count is None or count not in listed or set(range(count)) <= set(listed):
        return
    raise UserError(f"--seeds {count} is a count: it plans seeds 0..{count - 1} ({count} per cell), while {source} "
                    f"lists seeds {list(listed)}, {count} among them; to run seed {count} alone, write "
                    f"--seeds {count}, (a trailing comma makes a list)")


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _study_settings(out: str | None, argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(sweep settings, command settings)`` recorded by the study at ``out``, if one is there
    (its paths checked unless ``argv`` gives the flag that replaces them)."""
    from interp_toolkit.studies.grid.study import study_record_path, study_sweep

    if out is None or not study_record_path(out).exists():
        return None

    recorded = study_sweep(out)
    for flag, paths in (("--extend-from", recorded["extend_from"]), ("--recorded", recorded["recorded"])):
        for path in paths if _flag_value(argv, flag) is None else ():
            if not path.exists():  # moved since: say where the path came from, not only that it is missing
                raise UserError(f"study {out} was run with {flag} {path}, which is gone; pass {flag} with where it "
                                "is now, or the study's settings with --config FILE")
    return recorded["config"].to_dict(), {"extend_from": recorded["extend_from"], "recorded": recorded["recorded"]}


def _attribute_help(cls: type) -> dict[str, str]:
    """``{field: its text}`` from the ``Attributes:`` section of a Google-style class docstring
    (``a, b: text`` documents both)."""
    import inspect

    out: dict[str, str] = {}
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    names: list[str] = []
    inside = False
    for line in lines:
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):
            break
        head, sep, text = line.strip().partition(": ")
        if line.startswith("    ") and not line.startswith("        ") and sep:
            names = [name.strip() for name in head.split(",")]
            for name in names:
                out[name] = text
        else:
            for name in names:
                out[name] = f"{out[name]} {line.strip()}".strip()
    return out


def _sweep_flags() -> tuple[type, dict[str, tuple[str, str]]]:
    """The flags of ``sweep``: the command's own options, ``SweepConfig``'s grid and study
    settings, every section field as ``--SECTION.FIELD`` (``--train.lr``, ``--train.seed``,
    ``--model.act-fn``; the short spellings of :data:`~interp_toolkit.cli.flags.SHORT_FLAGS`,
    ``--lr``, ``--seq-len`` ..., work too), plus ``--grid SECTION.FIELD=V1,V2``. Built from the
    configs, so a new field is a new flag.

    Returns:
        ``(the flags dataclass, {flag field: (section, field)} of the section fields)``.
    """
    import typing

    import tyro

    def described(kind: Any, text: str, name: str | None = None) -> Any:
        return typing.Annotated[kind, tyro.conf.arg(name=name, help=" ".join(text.split()) or None)]

    fields: list[tuple[str, Any, Any]] = []
    command_help = _attribute_help(SweepCommandConfig)
    command_types = typing.get_type_hints(SweepCommandConfig, include_extras=True)
    for f in dataclasses.fields(SweepCommandConfig):
        if f.name != "sweep":
            fields.append((f.name, described(command_types[f.name], command_help.get(f.name, "")), f))
    sweep_help = _attribute_help(SweepConfig)
    sweep_types = typing.get_type_hints(SweepConfig)
    for f in dataclasses.fields(SweepConfig):
        if f.name not in (*SECTIONS, "grid"):
            fields.append((f.name, described(sweep_types[f.name], sweep_help.get(f.name, "")), None))
    sections: dict[str, tuple[str, str]] = {}
    classes = SweepConfig.config_classes()
    for section in SECTIONS:
        cls = classes[section]
        hints = typing.get_type_hints(cls)
        helps = _attribute_help(cls)
        for name in SweepConfig.section_defaults(section):
            field_name = f"{section}__{name}"  # the flag is --SECTION.FIELD, as train spells it
            sections[field_name] = (section, name)
            fields.append((field_name, described(hints[name], f"{cls.__name__}.{name}: {helps.get(name, '')}",
                                                 name=f"{section}.{name}"), None))
    fields.append(("grid", described(list[str], "More grid axes: SECTION.FIELD=V1,V2 (e.g. train.batch_size=256,none); "
                                     "each is a cell setting of its own"), None))
    spec = [(name, kind, dataclasses.field(default=None)) for name, kind, _ in fields]
    flags = dataclasses.make_dataclass("SweepFlags", spec, bases=(Config,))
    return flags, sections


def _setting_value(text: str) -> Any:
    """A grid value typed as written: none/null, true/false, an integer, a number, or text."""
    lowered = text.strip().lower()
    if lowered in ("none", "null", "full"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def _grid_of_flags(entries: Sequence[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for entry in entries:
        axis, sep, values = entry.partition("=")
        if not sep or not values.strip():
            raise UserError(f"--grid {entry!r}: expected SECTION.FIELD=V1,V2 (e.g. train.batch_size=256,none)")
        grid[axis.strip()] = [_setting_value(v) for v in values.split(",") if v.strip()]
    return grid


def parse(argv: Sequence[str], prog: str = "interp-toolkit sweep") -> SweepCommandConfig:
    """``argv`` (after ``sweep``) -> a validated :class:`SweepCommandConfig` (preset, file, flags)."""
    config_file, rest = split_config_flag(argv)
    rest, seed_count = _expand_lists(rest)
    preset = _flag_value(rest, "--preset")
    study = None if preset or config_file else _study_settings(_flag_value(rest, "--out"), rest)
    if preset is None and config_file is None and study is None:
        preset = "smoke"
    if preset is not None and preset not in PRESETS:
        raise UserError(f"unknown sweep preset {preset!r}; expected one of {sorted(PRESETS)}")
    sweep_data: dict[str, Any] = dict(PRESETS[preset]) if preset else {}
    command_data: dict[str, Any] = {}
    if study is not None:
        sweep_data, command_data = study
    if config_file is not None:
        data = load_config_file(config_file)
        command_fields = {f.name for f in dataclasses.fields(SweepCommandConfig)} - {"sweep"}
        command_data = {k: v for k, v in data.items() if k in command_fields}
        sweep_data = nested_settings(sweep_data)
        given = nested_settings(data.get("sweep") or {k: v for k, v in data.items() if k not in command_fields})
        for key, value in given.items():  # a file's section settings add to the preset's
            sweep_data[key] = {**sweep_data.get(key, {}), **value} if key in SECTIONS else value
        if data.get("sweep") and "device" in data:  # earlier files: device beside the sweep section
            sweep_data.setdefault("device", data["device"])
    default = SweepCommandConfig.from_dict({**command_data, "sweep": SweepConfig.from_dict(sweep_data)})
    if config_file is not None or study is not None:
        _check_seed_count(seed_count, default.sweep.seeds,
                          f"the config {config_file}" if config_file is not None else "the study at --out")
    flags, section_flags = _sweep_flags()
    cfg = default.sweep
    values = {f.name: getattr(default, f.name) for f in dataclasses.fields(SweepCommandConfig) if f.name != "sweep"}
    values.update({f.name: getattr(cfg, f.name) for f in dataclasses.fields(SweepConfig)
                   if f.name not in (*SECTIONS, "grid")})
    values.update({flag: getattr(cfg, section)[name] for flag, (section, name) in section_flags.items()})
    values["train__betas"] = tuple(values["train__betas"])
    values["grid"] = [f"{axis}={','.join('none' if v is None else str(v) for v in vals)}"
                      for axis, vals in cfg.grid.items()]
    parsed = parse_config(flags, rest, default=flags(**values), prog=prog, description=DESCRIPTION,
                          aliases=SHORT_FLAGS)
    chosen = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed)}
    command = {f.name: chosen.pop(f.name) for f in dataclasses.fields(SweepCommandConfig) if f.name != "sweep"}
    sweep: dict[str, Any] = {"grid": _grid_of_flags(chosen.pop("grid") or [])}
    for flag, (section, name) in section_flags.items():
        sweep.setdefault(section, {})[name] = chosen.pop(flag)
    sweep.update(chosen)
    return SweepCommandConfig.from_dict({**command, "sweep": type(cfg).from_dict(sweep)})


def _state_text(run: dict) -> str:
    if run.get("finished"):
        return "finished, " + ("generalized" if run.get("generalized") else "not generalized")
    if run.get("trained"):  # a seed done before the rest of its job: its outcome comes with the job's end
        stop = run.get("stopped_early_at")
        done = f"stopped early at epoch {stop}" if stop is not None else "trained"
        return f"{done}, outcome written when its job ends" + (f" ({run['running']})" if run.get("running") else "")
    if run.get("running"):
        return f"running ({run['running']})"
    if run["status"] == "resume":
        start = run.get("resume_epoch")
        return f"stopped, resumes from epoch {start}" if start is not None else "started, restarts from epoch 0"
    return run["status"]


def progress_lines(runs: list[dict]) -> list[str]:
    """One line per run that has a directory in the study (name, state, last evaluation)."""
    here = [run for run in runs if "run" in run]
    if not here:
        return []
    lines = [f"runs here ({len(here)}): state, last evaluation (train / val / adv accuracy)"]
    width = max(len(run["run"]) for run in here)
    for run in here:
        last = "nothing logged yet"
        if run.get("epoch") is not None:
            accs = " / ".join(
                "-" if run.get(k) is None else f"{run[k]:.3f}" for k in ("train_acc", "val_acc", "adv_acc")
            )
            last = f"epoch {run['epoch']}/{run['epochs']}  {accs}"
        lines.append(f"  {run['run']:<{width}}  {_state_text(run)}; {last}")
    return lines


def run_config(args: SweepCommandConfig) -> int:
    """``interp-toolkit sweep``."""
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.studies.sweep.run import plan_sweep, run_sweep

    cfg = args.sweep
    if args.backend == "local" and not args.dry_run:
        resolve_device(cfg.device)  # this machine is the worker: an unavailable device fails before any work
    # With Ray the device is resolved on each worker: a CPU-only head node drives GPU nodes.
    if args.dry_run:
        from interp_toolkit.studies.sweep.resources import sweep_cost
        plan = plan_sweep(cfg, args.out, recorded=args.recorded, extend_from=args.extend_from)
        print(json.dumps(cfg.to_dict(), indent=2))
        print(f"{len(cfg.cells())} cells x {len(cfg.seeds)} seeds = {cfg.n_runs()} runs")
        print(f"study {plan['study_dir']} ({'exists' if plan['exists'] else 'new'}): {plan['finished']} finished "
              f"there, {plan['recorded']} finished in recorded outcomes, {plan['resume']} to resume, "
              f"{plan['extend']} to extend from shorter runs, {plan['new']} to start")
        if plan["in_use_by"]:
            print(f"a sweep is running on it now: {plan['in_use_by']}")
        print(f"expected cost ({cfg.train.epochs:,} epochs per run):")
        for line in sweep_cost(cfg, args.jobs_per_gpu).lines():
            print(f"  {line}")
        for line in progress_lines(plan["runs"]):
            print(line)
        return 0
    if args.state is not None:
        return _run_campaign(args)
    from interp_toolkit.loggers import loggers_from_flags
    from interp_toolkit.studies.grid.study import default_study_dir

    study_name = (args.out if args.out is not None else default_study_dir(cfg)).name  # the W&B group by default
    result = run_sweep(cfg, args.out, backend=args.backend, workers=args.workers, address=args.address,
                       progress=not args.quiet, report=False, callbacks=loggers_from_flags(args, group=study_name),
                       recorded=args.recorded, log_every=args.log_every, extend_from=args.extend_from,
                       jobs_per_gpu=args.jobs_per_gpu, retries=args.retries)
    recorded = f", {result.n_recorded} taken from recorded outcomes" if args.recorded else ""
    print(f"study {result.study_dir}: {len(result.rows) + result.n_recorded} runs ({result.n_cached} cached{recorded}) "
          f"in {result.seconds:.0f} s")
    from interp_toolkit.studies.report.write import write_report

    write_report(result.study_dir, print_table=True)
    if result.failed:
        import sys

        for row in result.failed:
            print(f"failed run {row['run_dir']}: {' '.join(row['error'].split())}", file=sys.stderr)
        print(f"error: {len(result.failed)} run(s) of the sweep failed (listed above, with the run directories "
              "to inspect); the others finished; rerun the same command to resume them", file=sys.stderr)
        return 2
    return 0


def _run_campaign(args: SweepCommandConfig) -> int:
    """``interp-toolkit sweep --state DIR [--budget T | --status]``: one session of a campaign."""
    from interp_toolkit.studies.grid.study import default_study_dir
    from interp_toolkit.studies.sweep.campaign import (
        campaign_status,
        parse_duration,
        run_campaign,
        status_table,
        write_status,
    )

    assert args.state is not None
    if args.status:
        print(status_table(campaign_status(args.sweep, args.state)), end="")
        print(f"written to {write_status(args.sweep, args.state)}")
        return 0
    from interp_toolkit.loggers import loggers_from_flags

    study_dir = args.out if args.out is not None else default_study_dir(args.sweep)
    budget = parse_duration(args.budget) if args.budget is not None else None
    done = run_campaign(args.sweep, study_dir, args.state, budget, workers=args.workers, progress=not args.quiet,
                        log_every=args.log_every, callbacks=loggers_from_flags(args, group=Path(study_dir).name),
                        recorded=args.recorded)
    result, session = done["result"], done["session"]
    if done["restored"]:
        print(f"restored {len(done['restored'])} run(s) from {args.state}")
    print(f"study {result.study_dir}: {len(result.rows)} runs finished, {len(result.paused)} paused, "
          f"{len(result.failed)} failed in {session['wall_s']:.0f} s; state saved to {args.state} "
          f"({done['bytes_saved'] / 1e6:.1f} MB written)")
    print(status_table(campaign_status(args.sweep, args.state)), end="")
    if result.failed:
        import sys

        for row in result.failed:
            print(f"failed run {row['run_dir']}: {' '.join(row['error'].split())}", file=sys.stderr)
        print(f"error: {len(result.failed)} run(s) of the campaign failed (listed above); rerun the same command "
              "to resume them", file=sys.stderr)
        return 2
    if result.paused:
        print("paused: rerun the same command (here or on a fresh clone holding the state folder) to continue")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m interp_toolkit.cli.sweep ...``: the same as ``interp-toolkit sweep ...``."""
    import sys

    from interp_toolkit.cli import main as cli_main

    return cli_main(["sweep", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["ALIASES", "DESCRIPTION", "SweepCommandConfig", "main", "parse", "run_config"]
