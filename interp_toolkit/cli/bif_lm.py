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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Sequence

import tyro

from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
from interp_toolkit.analyses.bif.config import LocalizeConfig, SamplerConfig
from interp_toolkit.cli.bif import check_calibration_grids
from interp_toolkit.config import Config, parse_config
from interp_toolkit.errors import UserError
from interp_toolkit.studies.bif.checkpoint import calibration_lines
from interp_toolkit.studies.lm.series import (
    bif_over_checkpoints,
    calibrate_lm_checkpoint,
    corpus_sets,
    default_claims,
    testbed_corpus,
    testbed_seed,
)

if TYPE_CHECKING:
    from interp_toolkit.analyses.bif.token_classes import TextClassesConfig

__all__ = ["DESCRIPTION", "LMBIFCommandConfig", "main", "parse", "run_config", "run_lm_bif_command",
           "text_classes_config"]

DESCRIPTION = ("Token-level BIF (Bayesian influence functions) of a language model over a series of "
               "checkpoints: per token-class tables, plots and a summary under --out.")


@dataclass
class LMBIFCommandConfig(Config):
    """Settings of ``interp-toolkit bif-lm`` (every field is a flag; ``--config FILE`` sets them too).

    Attributes:
        checkpoints: Run dir, HF checkpoint folder(s), .safetensors, hub:NAME@REV,...
        corpus_config: CorpusConfig as JSON (default: from the testbed's testbed.json).
        out: Output / cache directory.
        n_posterior: Training sequences of the posterior.
        n_train: Recorded training sequences.
        n_query: Recorded held-out query sequences.
        reductions: Reductions of the token-level BIF matrix (class:class, class:all, ...).
        pearson_convention: -Corr of a group (with --pearson): token_mean = mean of token
            correlations (devinterp's; the paper does not say which), group_means = correlation of group means.
        stderr_method: Standard error of the pooled estimate: jackknife (leave-one-chain-out)
            or per_chain (std of the chains' estimates / sqrt(chains)).
        device: cpu, cuda, cuda:N or auto (checked before any work).
        format: Figure file format (png, svg or pdf).
        sampler: SGLD settings (--sampler.eps, --sampler.chains, ...; short: --eps, --chains).
        convergence: Adaptive chain length (--adaptive, the default: draws and burn-in double
            per checkpoint until R-hat <= 1.01 and ESS >= 100, or --max-steps SGLD steps per
            chain would be exceeded; summary.json records every round and which stopped it).
        localize: How gamma and eps are chosen (--localize.auto, the default: per checkpoint, the
            smallest gamma whose prior-only cloud climbs at most 2.5% of the gap between the
            checkpoint's posterior loss and the unigram loss of the posterior tokens, and
            eps = min(0.3 / gamma, 1 / (n_beta x the largest Hessian eigenvalue at the
            checkpoint)); overrides --gamma and --eps, which --localize.no-auto keeps).
        classes_config: Real text instead of the synthetic corpus: TextClassesConfig as
            JSON/YAML (the text flags below override it).
        text: Real text: a text file (one document per line) or a datasets.Dataset saved
            with save_to_disk.
        tokenizer: Tokenizer directory (default: the first checkpoint's).
        seq_len: Tokens per sequence of the text (default 64).
        pack: Pack documents into rows (--no-pack: one sequence per document).
        text_column: Text column of a Dataset (default 'text').
        delimiters: Mark open/close delimiter tokens (--no-delimiters: do not).
        induction: Mark induction tokens (--no-induction: do not).
        token_class: A user token class by token ids, NAME=ID,ID,...
        token_class_regex: A user token class by a regex on the token text, NAME=REGEX.
        claims: Class-to-class influences for claims.csv and one figure each, as
            SOURCE->TARGET or SOURCE->TARGET - SOURCE->TARGET (a difference); repeat the flag.
            Default: induction->induction, open->close, close->open and
            open->close - close->open, those whose classes the recorded tokens have.
        training_seed: The seed column of claims.csv (default: the testbed's training seed
            from its testbed.json, else 0).
        replot: Only redraw the claim figures under --out from this claims.csv (no sampling,
            no checkpoints needed).
        calibrate: Instead of the series: sweep eps x gamma (x n_beta) at the first checkpoint
            given, on the same posterior (the mean next-token loss of the posterior sequences),
            and recommend a setting (calibration_<key>.json and .png under --out).
        calibrate_eps: Step sizes of the sweep (default: eps / 10, eps, eps * 10).
        calibrate_gamma: Localization strengths of the sweep (default: gamma).
        calibrate_n_beta: n * beta of the sweep (default: n_beta).
    """

    checkpoints: Annotated[
        tuple[str, ...], tyro.conf.Positional,
        tyro.conf.arg(metavar="CHECKPOINTS", help_behavior_hint="(one or more; required)"),
    ] = ()
    corpus_config: Path | None = None
    out: Path = Path("runs/bif_lm")
    n_posterior: int = 512
    n_train: int = 16
    n_query: int = 16
    reductions: tuple[str, ...] = ("class:class", "class:all", "sequence:sequence")
    pearson_convention: Literal["token_mean", "group_means"] = "token_mean"
    stderr_method: Literal["jackknife", "per_chain"] = "jackknife"
    device: str = "cpu"
    format: Literal["png", "svg", "pdf"] = "png"
    sampler: SamplerConfig = field(default_factory=lambda: SamplerConfig(
        eps=1e-4, chains=4, draws=50, burn_in=50, steps_between_draws=1, batch_size=32))
    convergence: AdaptiveConfig = field(default_factory=lambda: AdaptiveConfig(max_steps=1600))
    localize: LocalizeConfig = field(default_factory=LocalizeConfig)
    classes_config: Path | None = None
    text: str | None = None
    tokenizer: str | None = None
    seq_len: int | None = None
    pack: bool = True
    text_column: str | None = None
    delimiters: bool = True
    induction: bool = True
    token_class: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    token_class_regex: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    claims: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    training_seed: int | None = None
    replot: Path | None = None
    calibrate: bool = False
    calibrate_eps: tuple[float, ...] = ()
    calibrate_gamma: tuple[float, ...] = ()
    calibrate_n_beta: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        self.claims = tuple(self.claims)
        if isinstance(self.replot, str):
            self.replot = Path(self.replot)
        from interp_toolkit.analyses.bif.claims import parse_claim

        for claim in self.claims:
            try:
                parse_claim(claim)
            except (ValueError, UserError) as err:
                raise UserError(f"--claims: {err}") from err
        self.checkpoints = tuple(str(c) for c in self.checkpoints)
        self.reductions = tuple(self.reductions)
        self.token_class = tuple(self.token_class)
        self.token_class_regex = tuple(self.token_class_regex)
        self.check("format", self.format in ("png", "svg", "pdf"), "one of png, svg, pdf")
        for name in ("corpus_config", "out", "classes_config"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, Path(getattr(self, name)))
        self.check("pearson_convention", self.pearson_convention in ("token_mean", "group_means"),
                   "'token_mean' or 'group_means'")
        self.check("stderr_method", self.stderr_method in ("jackknife", "per_chain"), "'jackknife' or 'per_chain'")
        check_calibration_grids(self)
        from interp_toolkit.analyses.bif.adaptive import check_budget

        check_budget(self.sampler, self.convergence)  # sized before any checkpoint is read


def text_classes_config(args: LMBIFCommandConfig) -> TextClassesConfig | None:
    """The :class:`TextClassesConfig` of ``--classes-config`` overridden by the text flags,
    or ``None`` when neither names a text (the synthetic corpus is used).

    Raises:
        UserError: A malformed ``--token-class`` / ``--token-class-regex``, token-class
            options without a text, or a field the config refuses.
    """
    from interp_toolkit.analyses.bif.token_classes import TextClassesConfig

    base = TextClassesConfig.from_file(args.classes_config).to_dict() if args.classes_config is not None else {}
    for key in ("text", "tokenizer", "seq_len", "text_column"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    for key in ("pack", "delimiters", "induction"):
        if not getattr(args, key):  # the flags only switch off (so a config file's false is kept)
            base[key] = False
    for flag, key in (("token_class", "user_classes"), ("token_class_regex", "user_class_regex")):
        for item in getattr(args, flag):
            name, sep, value = item.partition("=")
            option = "--" + flag.replace("_", "-")
            if not sep or not name:
                raise UserError(f"{option} {item!r} must be NAME=VALUE")
            if flag == "token_class":
                try:
                    parsed: Any = [int(x) for x in value.split(",") if x.strip()]
                except ValueError as err:
                    raise UserError(f"{option} {item!r}: expected NAME=ID,ID,... with integer ids") from err
            else:
                parsed = value
            base.setdefault(key, {})[name] = parsed
    if not base.get("text"):
        if base:
            raise UserError("token-class options need a text: pass --text FILE_OR_DATASET_DIR (or 'text' in "
                            "--classes-config)")
        return None
    text = Path(str(base["text"]))
    if text.is_file():  # a text that is not UTF-8 is named now, before a tokenizer or checkpoint loads
        from interp_toolkit.io import read_utf8

        read_utf8(text, "a UTF-8 text file, one document per line (--text)", UserError)
    return TextClassesConfig.from_dict(base)


def _calibrate(args: LMBIFCommandConfig, ref: Any, sets: Any) -> dict[str, Any]:
    return calibrate_lm_checkpoint(ref, sets, args.sampler, args.out,
                                   sizes=(args.n_posterior, args.n_train, args.n_query), eps=args.calibrate_eps,
                                   gamma=args.calibrate_gamma, n_beta=args.calibrate_n_beta, figure_format=args.format,
                                   localize=args.localize)


def run_lm_bif_command(args: LMBIFCommandConfig) -> str:
    """Everything ``interp-toolkit bif-lm`` does: validate every input, then compute and write;
    returns the line the command prints."""
    from interp_toolkit.analyses.bif.lm import LMBIFConfig
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.sources import resolve_checkpoints
    from interp_toolkit.tasks.induction_corpus import CorpusConfig

    if args.replot is not None:
        from interp_toolkit.studies.lm.claims import read_claims_csv, write_claim_figures

        paths = write_claim_figures(read_claims_csv(args.replot), args.out, args.format)
        return f"wrote {len(paths)} claim figures from {args.replot}: " + ", ".join(str(p) for p in paths)
    resolve_device(args.device)  # a bad or unavailable device fails before any work
    config = LMBIFConfig(args.sampler, reductions=tuple(args.reductions), pearson_convention=args.pearson_convention,
                         stderr_method=args.stderr_method)
    text_config = text_classes_config(args)
    refs = resolve_checkpoints(list(args.checkpoints))
    if text_config is not None:
        from interp_toolkit.analyses.bif.token_classes import load_tokenizer

        tokenizer = load_tokenizer(text_config.tokenizer or refs[0].location)
        classes = text_config.classes(tokenizer, max_sequences=args.n_posterior + args.n_query)
        sets = classes.bif_sets(args.n_posterior, args.n_train, args.n_query)
        if args.calibrate:
            return calibration_lines(_calibrate(args, refs[0], sets))
        claims = args.claims or default_claims(sets[1], sets[2])
        rows = bif_over_checkpoints(refs, None, config, args.out, n_posterior=args.n_posterior, n_train=args.n_train,
                                    n_query=args.n_query, progress=args.sampler.progress, sets=sets,
                                    probe_vocab=(0, len(tokenizer)), figure_format=args.format, claims=claims,
                                    adaptive=args.convergence, localize=args.localize,
                                    training_seed=args.training_seed if args.training_seed is not None else 0)
        return (f"wrote {args.out / 'per_class.csv'} and {args.out / f'per_class.{args.format}'} ({len(refs)} "
                f"checkpoints, {len(rows)} rows, classes {classes.names})")
    corpus: CorpusConfig | None
    if args.corpus_config is not None:
        from interp_toolkit.userfiles import read_mapping_file

        corpus = CorpusConfig.from_dict(read_mapping_file(args.corpus_config, "corpus config"))
    else:
        corpus = testbed_corpus(refs)
        if corpus is None:
            raise UserError("no corpus config: pass --corpus-config corpus.json (a CorpusConfig as JSON) "
                            "or checkpoints of a testbed run (with testbed.json)")
    posterior, train, query = corpus_sets(corpus, args.n_posterior, args.n_train, args.n_query)
    if args.calibrate:
        return calibration_lines(_calibrate(args, refs[0], (posterior, train, query)))
    claims = args.claims or default_claims(train, query)
    training_seed = args.training_seed if args.training_seed is not None else testbed_seed(refs)
    rows = bif_over_checkpoints(refs, corpus, config, args.out, n_posterior=args.n_posterior, n_train=args.n_train,
                                n_query=args.n_query, progress=args.sampler.progress, figure_format=args.format,
                                claims=claims, training_seed=training_seed, adaptive=args.convergence,
                                localize=args.localize)
    return (f"wrote {args.out / 'per_class.csv'} and {args.out / ('per_class.' + args.format)} ({len(refs)} "
            f"checkpoints, {len(rows)} rows)")




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
