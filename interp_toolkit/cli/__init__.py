"""The ``interp-toolkit`` command line: one module per subcommand, one error handler.

Subcommands (module ``interp_toolkit.cli.<module>``; each has ``HELP``, ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``):

  train    train one MPSP model with checkpoints            (:mod:`.train`)
  info     print a checkpoint's or run's config and metrics  (:mod:`.info`)
  demo     a small MPSP run with curves and a summary        (:mod:`.demo`)
  sweep    a resumable seed sweep of MPSP cells              (:mod:`.sweep`)
  report   generalization-rate table of a study directory    (:mod:`.report`)
  analyze  a circuit analysis over a run's checkpoints       (:mod:`.analyze`)
  bif      Bayesian influence functions at an MPSP checkpoint (:mod:`.bif`)
  bif-lm   token-level BIF of a language model over checkpoints (:mod:`.bif_lm`)

Error contract of :func:`main`: a user error (:class:`interp_toolkit.errors.UserError`, any
``ValueError``, a missing file) prints one ``error: ...`` line on stderr and returns 2; an
interrupt (Ctrl-C) prints one line and returns 130; anything else is a bug: a short message
and the path of a log file holding the traceback, status 1. Only the chosen subcommand's
module is imported, and heavy libraries (torch, TransformerLens) only inside handlers, so
``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

# name -> (module, one-line help); the module is imported only when the command is used.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("interp_toolkit.cli.train", "train one MPSP model with checkpoints"),
    "info": ("interp_toolkit.cli.info", "print a checkpoint's config, metadata and accuracies"),
    "demo": ("interp_toolkit.cli.demo", "train a small MPSP model and write its curves and a summary"),
    "sweep": ("interp_toolkit.cli.sweep", "run a seed sweep of MPSP cells (resumable, cached per run)"),
    "report": ("interp_toolkit.cli.report", "generalization-rate table and plots of a study directory"),
    "analyze": ("interp_toolkit.cli.analyze",
                "run a circuit analysis over a run's checkpoints (CSV + PNG in the run dir)"),
    "bif": ("interp_toolkit.cli.bif", "Bayesian influence functions at an MPSP checkpoint"),
    "bif-lm": ("interp_toolkit.cli.bif_lm", "token-level BIF of a language model across checkpoints"),
}

INTERRUPTED = 130
USER_ERROR = 2
BUG = 1


def _chosen_command(argv: Sequence[str]) -> str | None:
    for token in argv:
        if token in COMMANDS:
            return token
        if not token.startswith("-"):
            return None
    return None


def build_parser(argv: Sequence[str] | None = None, full: bool = False) -> argparse.ArgumentParser:
    """The ``interp-toolkit`` parser.

    Args:
        argv: The arguments about to be parsed: only the subcommand they name gets its
            options (and its module imported), which keeps ``--help`` fast.
        full: Add every subcommand's options (for docs and tests).
    """
    from interp_toolkit import __version__

    parser = argparse.ArgumentParser(
        prog="interp-toolkit",
        description="Mechanistic-interpretability studies on TransformerLens 4: train MPSP models "
        "with checkpoints, inspect checkpoints, run analyses.",
    )
    parser.add_argument("--version", action="version", version=f"interp-toolkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = _chosen_command(argv or [])
    for name, (module_name, help_text) in COMMANDS.items():
        if not full and name != chosen:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=getattr(module, "DESCRIPTION", help_text))
        if hasattr(module, "parse"):  # flags generated from a config class: parsed by the module
            p.add_argument("args", nargs=argparse.REMAINDER, help=f"see interp-toolkit {name} --help")
            p.set_defaults(func=lambda a, m=module, n=name: m.run_config(m.parse(a.args, prog=f"interp-toolkit {n}")))
            continue
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def _log_bug(argv: Sequence[str]) -> Path:
    """Write the current traceback to a log file; returns its path."""
    folder = Path(os.environ.get("INTERP_TOOLKIT_LOG_DIR") or Path(tempfile.gettempdir()) / "interp-toolkit")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(f"interp-toolkit {' '.join(argv)}\n\n{traceback.format_exc()}")
    return path


def _run_with_contract(handler: Callable[[], int], argv: Sequence[str], command: str | None,
                       epoch_hint: Callable[[], int | None] = lambda: None) -> int:
    """Call ``handler`` under the CLI error contract (see the module docstring)."""
    try:
        status = handler()
        if not isinstance(status, int) or isinstance(status, bool):
            raise TypeError(f"handler of {command!r} returned {status!r}, expected an int exit status")
    except KeyboardInterrupt:
        epoch = epoch_hint()
        where = f" from epoch {epoch}" if epoch is not None else ""
        print(f"interrupted; rerun the same command to resume{where}", file=sys.stderr)
        return INTERRUPTED
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as err:
        message = str(err) if not isinstance(err, OSError) or not err.filename else (
            f"{err.strerror}: {err.filename}")
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        return USER_ERROR
    except SystemExit as exit_:  # a parser's --help (0) or usage error (2, already printed)
        return exit_.code if isinstance(exit_.code, int) else USER_ERROR
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        return BUG
    except Exception as err:  # noqa: BLE001 - the one place that turns a bug into a log file
        log = _log_bug(argv)
        print(f"interp-toolkit: internal error ({type(err).__name__}: {err}); traceback in {log}",
              file=sys.stderr)
        return BUG
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 bug, 2 user error, 130 interrupt).

    Commands whose module has ``parse(argv) -> config`` (flags generated from a config
    dataclass, plus ``--config FILE``) get the arguments after their name; the others an
    ``argparse`` namespace.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = _chosen_command(argv)
    if chosen is not None:
        module = importlib.import_module(COMMANDS[chosen][0])
        if hasattr(module, "parse"):
            rest = argv[argv.index(chosen) + 1:]
            prog = f"interp-toolkit {chosen}"
            parsed: dict[str, object] = {}

            def handler() -> int:
                parsed["config"] = module.parse(rest, prog=prog)
                return module.run_config(parsed["config"])

            def epoch_hint() -> int | None:  # where a rerun resumes, if the command knows
                where = getattr(module, "interrupted_at", None)
                return where(parsed["config"]) if where is not None and "config" in parsed else None

            return _run_with_contract(handler, argv, chosen, epoch_hint)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exit_:  # argparse: --help/--version (0) or a usage error (2, already printed)
        return exit_.code if isinstance(exit_.code, int) else USER_ERROR
    return _run_with_contract(lambda: args.func(args), argv, args.command,
                              lambda: getattr(args, "interrupted_at_epoch", None))


__all__ = ["COMMANDS", "build_parser", "main"]
