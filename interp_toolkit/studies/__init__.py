"""Studies built on the core, one subpackage each.

* :mod:`~interp_toolkit.studies.common`: a run's outcome from its metrics (``outcomes``), near
  misses, the statistics of rates (Wilson, Newcombe, Fisher, power).
* :mod:`~interp_toolkit.studies.grid`: what a sweep is: its config (``config.SweepConfig``), its
  cells, its study directory (``study``) and its outcome tables.
* :mod:`~interp_toolkit.studies.report`: tables of rates, the optimizer clock, plots and the
  markdown report (``write.write_report``).
* :mod:`~interp_toolkit.studies.sweep`: planning and running a sweep (``run.run_sweep``) on the
  local pool or Ray (``execution``), with resources and progress.
* :mod:`~interp_toolkit.studies.verdicts`: the verdict engine (``rules``) and every claim of both
  papers judged from the committed tables (``python -m interp_toolkit.studies.verdicts.table``).
* :mod:`~interp_toolkit.studies.mechanism`: the mechanism over checkpoints and its contrast
  across runs.
* :mod:`~interp_toolkit.studies.influence`: the joined study (per-example BIF across a run's
  phases; ``study``: over several runs).
* :mod:`~interp_toolkit.studies.lm`: the language-model testbed and its token-class BIF series.
* :mod:`~interp_toolkit.studies.bif`: one checkpoint's BIF (``checkpoint``), the deep-linear-network
  toy (``dln``), the hierarchy study (``hierarchy``) and its re-measurement (``remeasure``).
* :mod:`~interp_toolkit.studies.demo` and :mod:`~interp_toolkit.studies.rounding_probe`: the demo,
  and the probe of float rounding in one run's outcome.

The sweep entry points are importable from here too (loaded on first use, so importing this
package stays cheap).
"""

from __future__ import annotations

from interp_toolkit.lazy import lazy_exports

_EXPORTS = {
    "SweepConfig": "grid.config", "PRESETS": "grid.config", "preset": "grid.config",
    "run_sweep": "sweep.run", "plan_sweep": "sweep.run", "SweepResult": "sweep.run",
    "run_campaign": "sweep.campaign", "campaign_status": "sweep.campaign",
    "study_sweep": "grid.study", "collect_runs": "grid.study", "read_outcomes_csv": "grid.outcome_table",
    "select_runs": "grid.cells", "parse_cell_spec": "grid.cells", "find_cell": "grid.cells",
    "rate_table": "report.tables", "write_report": "report.write", "write_report_sources": "report.write",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), {name: f".{module}" for name, module in _EXPORTS.items()})

__all__ = sorted(_EXPORTS)
