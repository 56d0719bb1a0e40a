"""Studies built on the core: MPSP sweeps, outcomes, reports and the mechanism figure over
checkpoints, the LM induction testbed, the deep-linear-network toy.

The sweep and report layer, by module: :mod:`~interp_toolkit.studies.sweep_config` (the sweep
config, presets, every run's configs), :mod:`~interp_toolkit.studies.cells` (cell settings and
specs), :mod:`~interp_toolkit.studies.study` (a study directory's files, run collection, outcome
tables), :mod:`~interp_toolkit.studies.sweep` (planning and running),
:mod:`~interp_toolkit.studies.execution` (local pool, Ray, progress),
:mod:`~interp_toolkit.studies.statistics`, :mod:`~interp_toolkit.studies.tables`,
:mod:`~interp_toolkit.studies.report_format`, :mod:`~interp_toolkit.studies.report_plots` and
:mod:`~interp_toolkit.studies.report`. Their entry points are importable from here too (loaded
on first use, so importing this package stays cheap).
"""

from __future__ import annotations

from interp_toolkit.lazy import lazy_exports

_EXPORTS = {
    "SweepConfig": "sweep_config", "PRESETS": "sweep_config", "preset": "sweep_config",
    "run_sweep": "sweep", "plan_sweep": "sweep", "SweepResult": "sweep",
    "study_sweep": "study", "collect_runs": "study", "read_outcomes_csv": "outcome_table",
    "select_runs": "cells", "parse_cell_spec": "cells", "find_cell": "cells",
    "rate_table": "tables", "write_report": "report", "write_report_sources": "report",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), {name: f".{module}" for name, module in _EXPORTS.items()})

__all__ = sorted(_EXPORTS)
