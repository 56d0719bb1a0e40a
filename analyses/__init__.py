"""Reusable analysis modules (installed as ``interp_toolkit.analyses``).

Each works on any TransformerLens model (the toolkit's ``boot_native`` bridges and
``boot_transformers`` models) and returns an ``AnalysisResult`` (a tidy ``Table`` with
``.rows``/``.to_csv`` plus raw tensors):

* ``ablation``: zero / mean / resample ablation of heads, attention layers, MLPs and the
  residual stream (``ablation``, ``zero_ablation``, ``mean_ablation``, ``resample_ablation``);
* ``patching``: cross-split activation patching with minimal pairs
  (``minimal_pair_patching``), the index-paired
  ``resample_ablation_damage``, ``activation_patching``, low level ``compute_patching``;
* ``fingerprints``: QK magnitude and OV parity fingerprints per head (``fingerprints``,
  ``pre_softmax_scores``, circuits as ``FactoredMatrix``);
* ``gradients``: per-example gradients with torch.func and gradient conflict between
  shortcut-consistent and anti-shortcut examples (``gradient_conflict``,
  ``per_example_grads``);
* ``weights``: L2 norm of every parameter group and its distance and cosine to a reference
  such as the initialization (``weight_norms``, ``compute_weight_norms``), the slow variable
  of weight-decay-driven transitions;
* ``near_misses``: every split's wrong examples grouped by task features (count of odd
  values, label, shortcut, max and its multiplicity, max position or first value), with each
  group's size, accuracy and share of the training data (``near_misses``,
  ``failing_groups``, ``describe_groups``): which examples stand between a run and 100%;
* ``over_checkpoints``: any of them over a run's checkpoints, cached, as CSV + a figure
  (png, svg or pdf); the ``analyze`` subcommand lives in :mod:`interp_toolkit.cli.analyze`.

Submodules are imported on use, so ``import interp_toolkit.analyses`` stays cheap. Every
public name of every module imports from the package itself (``from interp_toolkit.analyses
import gradient_conflict, ablation``). A module named as its high-level function
(``ablation``, ``fingerprints``, ``near_misses``) is callable as that function, so whether a
name resolves to the module or the function, ``ablation(model, splits)`` works.
"""

from __future__ import annotations

import importlib

from interp_toolkit.lazy import lazy_exports

#: Modules whose public names (``__all__``) the package exports, in lookup order (a name in
#: two modules comes from the first: ``KINDS`` is ablation's).
_MODULES = ("ablation", "patching", "fingerprints", "gradients", "weights", "near_misses", "over_checkpoints",
            "induction")


def _export_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for module in _MODULES:
        for name in importlib.import_module(f"{__name__}.{module}").__all__:
            table.setdefault(name, f".{module}")
    return table


__getattr__, __dir__ = lazy_exports(__name__, globals(), _export_table, submodules=(*_MODULES, "bif"))
