"""Token-level BIF over a series of LM checkpoints: tables, plots and the ``bif-lm`` command.

``interp-toolkit bif-lm CHECKPOINTS... --out DIR`` (flags generated from
:class:`LMBIFCommandConfig`; ``bif`` is the MPSP single-checkpoint command of
:mod:`interp_toolkit.cli.bif`). ``CHECKPOINTS`` are specs understood by
:func:`interp_toolkit.sources.resolve_checkpoints`: a toolkit run directory, a folder of
local HF checkpoint directories (e.g. the testbed's ``checkpoints/``), single
checkpoints, or ``hub:EleutherAI/pythia-14m@step1000,step2000``.

Data: the induction/delimiter corpus (:mod:`interp_toolkit.tasks.induction_corpus`); its
config is read from a testbed ``testbed.json`` found at or above the first checkpoint, or
from ``--corpus-config``. The posterior is the first ``--n-posterior`` training sequences;
the recorded training tokens are the first ``--n-train`` of those; the query tokens are
``--n-query`` held-out sequences (same generator, another seed). Real text instead:
``--text FILE_OR_DATASET_DIR`` (plus ``--tokenizer``, ``--seq-len``, ``--token-class``,
``--token-class-regex``, ``--no-pack``, ``--no-delimiters``, ``--no-induction``, ... or
``--classes-config``; see
:class:`~interp_toolkit.analyses.bif.token_classes.TextClassesConfig`) marks delimiter,
induction and user token classes on the tokenized text.

Writes under ``--out``: one cached ``lm_bif_<hash>/`` per checkpoint, ``per_class.csv``
(step, checkpoint, induction score, train class, query group, BIF, stderr),
``per_class.png`` (BIF of each training-token class on the mean query loss over
checkpoints, with the induction score on a twin axis of the same time axis) and
``summary.json``.
"""

from __future__ import annotations

import sys
from typing import Sequence

from interp_toolkit.config import parse_config
from interp_toolkit.errors import UserError
from interp_toolkit.studies.lm.series import (
    CSV_FIELDS,
    LMBIFCommandConfig,
    bif_over_checkpoints,
    corpus_sets,
    plot_per_class,
    run_lm_bif_command,
    text_classes_config,
)

__all__ = ["CSV_FIELDS", "DESCRIPTION", "LMBIFCommandConfig", "bif_over_checkpoints", "corpus_sets", "main",
           "parse", "plot_per_class", "run_config", "text_classes_config"]

DESCRIPTION = ("Token-level BIF (Bayesian influence functions) of a language model over a series of "
               "checkpoints: per token-class tables, plots and a summary under --out.")


def parse(argv: Sequence[str], prog: str = "interp-toolkit bif-lm") -> LMBIFCommandConfig:
    """``argv`` (after ``bif-lm``) -> a validated :class:`LMBIFCommandConfig`."""
    config = parse_config(LMBIFCommandConfig, argv, prog=prog, description=DESCRIPTION)
    if not config.checkpoints and config.replot is None:
        raise UserError("bif-lm needs at least one CHECKPOINTS argument (run dir, HF checkpoint folder, "
                        ".safetensors or hub:NAME@REV)")
    return config


def run_config(args: LMBIFCommandConfig) -> int:
    """The ``bif-lm`` handler: validate everything, then compute (:func:`run_lm_bif_command`); returns 0."""
    print(run_lm_bif_command(args))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point, ``python -m interp_toolkit.cli.bif_lm ...``: ``interp-toolkit bif-lm ...``."""
    from interp_toolkit.cli import main as cli_main

    return cli_main(["bif-lm", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
