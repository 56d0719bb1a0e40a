"""Token-level BIF over a series of LM checkpoints: tables, plots and the work behind
``interp-toolkit bif-lm`` (:mod:`interp_toolkit.cli.bif_lm` holds the command's config and
reads its inputs).

Checkpoint specs are resolved by :func:`interp_toolkit.sources.resolve_checkpoints`. Data:
the induction/delimiter corpus (:mod:`interp_toolkit.tasks.induction_corpus`), its config
read from a testbed ``testbed.json`` at or above the first checkpoint or given; or real text
with token classes (:class:`~interp_toolkit.analyses.bif.token_classes.TextClassesConfig`).
Writes one cached ``lm_bif_<hash>/`` per checkpoint, ``per_class.csv``, ``per_class.png``,
``summary.json`` (with each checkpoint's convergence verdict), and the claim series
``claims.csv`` with one ``claim_<series>.png`` each (:mod:`interp_toolkit.studies.lm.claims`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig
from interp_toolkit.analyses.bif.config import LocalizeConfig, SamplerConfig
from interp_toolkit.errors import UserError, notice
from interp_toolkit.io import atomic_write_json, atomic_write_text
from interp_toolkit.studies.bif.checkpoint import (
    round_notice,
)

if TYPE_CHECKING:
    import torch

    from interp_toolkit.analyses.bif.lm import LMBIFConfig
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet
    from interp_toolkit.sources import CheckpointRef
    from interp_toolkit.tasks.induction_corpus import CorpusConfig

__all__ = ["CSV_FIELDS", "bif_over_checkpoints", "calibrate_lm_checkpoint", "check_claims", "corpus_sets",
           "default_claims", "plot_per_class", "sequence_loss", "testbed_corpus", "testbed_seed"]

#: What the locality gate's reference loss is for a language model.
UNIGRAM = "unigram cross-entropy of the posterior tokens"
CSV_FIELDS = ["step", "checkpoint", "induction_score", "reduction", "train_group", "query_group", "bif", "stderr",
              "verdict", "climb"]


def corpus_sets(
    corpus: CorpusConfig, n_posterior: int, n_train: int, n_query: int, query_seed_offset: int = 10_007
) -> tuple[torch.Tensor, TokenSet, TokenSet]:
    """Posterior tokens, recorded training tokens and held-out query tokens with classes."""
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet
    from interp_toolkit.tasks.induction_corpus import (
        CLASS_NAMES,
        CorpusConfig,
        make_corpus,
        target_classes,
    )

    for name, value in (("n_posterior", n_posterior), ("n_train", n_train), ("n_query", n_query)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be an integer >= 1, got {value!r}")
    if n_train > n_posterior:
        raise UserError(f"n_train ({n_train}) must be <= n_posterior ({n_posterior}): recorded tokens are training "
                        "tokens")
    if n_posterior > corpus.n_sequences:
        raise UserError(f"n_posterior ({n_posterior}) exceeds the corpus's {corpus.n_sequences} sequences")
    train_corpus = make_corpus(corpus)
    held_out = make_corpus(CorpusConfig.from_dict({**corpus.to_dict(), "n_sequences": n_query,
                                                   "seed": corpus.seed + query_seed_offset}))
    posterior = train_corpus.tokens[:n_posterior]
    train = TokenSet(posterior[:n_train], target_classes(train_corpus.classes[:n_train]), CLASS_NAMES)
    query = TokenSet(held_out.tokens, target_classes(held_out.classes), CLASS_NAMES)
    return posterior, train, query


def bif_over_checkpoints(
    refs: Sequence[CheckpointRef],
    corpus: CorpusConfig | None,
    config: LMBIFConfig,
    out_dir: str | Path,
    *,
    n_posterior: int = 512,
    n_train: int = 16,
    n_query: int = 16,
    induction_half_len: int | None = None,
    progress: bool = True,
    sets: tuple[torch.Tensor, TokenSet, TokenSet] | None = None,
    probe_vocab: tuple[int, int] | None = None,
    figure_format: str = "png",
    claims: Sequence[str] = (),
    training_seed: int = 0,
    adaptive: AdaptiveConfig | None = None,
    localize: LocalizeConfig | None = None,
) -> list[dict[str, Any]]:
    """Token-level BIF and induction score at every checkpoint; writes CSV, PNG and JSON.

    Args:
        refs: Checkpoints (the time axis is ``ref.step``; the list index if unknown).
        corpus: Corpus config of the training data.
        config: Sampler settings and reductions (``"class:all"`` is added if missing: it
            is what the plot shows).
        out_dir: Output and cache directory (a rerun reuses every cached checkpoint).
        n_posterior, n_train, n_query: Sequence counts (see :func:`corpus_sets`).
        induction_half_len: Length of the repeated half of the induction probe (default
            ``(seq_len - 1) // 2``).
        progress: tqdm bars.
        sets: ``(posterior tokens, train, query)`` to use instead of the corpus's (e.g.
            :meth:`~interp_toolkit.analyses.bif.token_classes.TokenClasses.bif_sets` of real
            text); ``corpus`` may then be ``None``.
        probe_vocab: Token range ``[low, high)`` of the induction probe (default: the
            corpus's ordinary tokens).
        figure_format: ``png``, ``svg`` or ``pdf`` (``per_class.<format>``).
        claims: Class-to-class influences to report (``"A->B"`` or ``"A->B - C->D"``,
            :mod:`interp_toolkit.analyses.bif.claims`): written to ``claims.csv``
            (:data:`~interp_toolkit.studies.lm.claims.CLAIM_CSV_FIELDS`) with one
            ``claim_<series>.<format>`` figure each. Checked against the recorded tokens'
            classes before any sampling.
        training_seed: The ``seed`` column of ``claims.csv`` (the checkpoints' training seed).
        adaptive: Chain length per checkpoint: by default draws and burn-in double until the
            chains converge or ``max_steps`` SGLD steps per chain would be exceeded
            (:mod:`interp_toolkit.analyses.bif.adaptive`); ``summary.json`` records each
            checkpoint's rounds and verdict. ``AdaptiveConfig(adaptive=False)``: one round.
        localize: gamma and eps per checkpoint (default ``LocalizeConfig()``: derived,
            :mod:`interp_toolkit.analyses.bif.localize`, against the unigram loss of the
            posterior tokens; ``auto=False`` keeps ``config.sampler``'s). Every checkpoint's
            draws are gated for locality against that reference: the ``verdict`` and ``climb``
            columns, and ``summary.json``'s ``sampling_verdict`` / ``locality``.

    Returns:
        The CSV rows (also in ``per_class.csv``).
    """
    from interp_toolkit.analyses.bif.adaptive import ROUNDS_DIR, keep_final_round, until_converged
    from interp_toolkit.analyses.bif.claims import claim_influences
    from interp_toolkit.analyses.bif.diagnostics import advice_for
    from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
    from interp_toolkit.analyses.bif.locality import unigram_loss
    from interp_toolkit.analyses.bif.localize import local_gamma, localized_sampler
    from interp_toolkit.analyses.induction import induction_scores
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.progress import progress_bar
    from interp_toolkit.studies.lm.claims import claim_rows, write_claim_figures, write_claims_csv
    from interp_toolkit.tasks.induction_corpus import repeated_random_tokens

    figure_format = check_format(figure_format)
    adaptive = AdaptiveConfig() if adaptive is None else adaptive
    localize = LocalizeConfig() if localize is None else localize
    rounds_dir = Path(out_dir) / ROUNDS_DIR if adaptive.adaptive else Path(out_dir)
    if not refs:
        raise UserError("no checkpoints given")
    if "class:all" not in config.reductions:
        config = LMBIFConfig.from_dict({**config.to_dict(), "reductions": [*config.reductions, "class:all"]})
    out = Path(out_dir)
    if sets is not None:
        posterior, train, query = sets
    elif corpus is not None:
        posterior, train, query = corpus_sets(corpus, n_posterior, n_train, n_query)
    else:
        raise UserError("bif_over_checkpoints needs a corpus or sets, got neither")
    seq_len = int(posterior.shape[1])
    half = induction_half_len or (seq_len - 1) // 2
    if probe_vocab is not None:
        low, high = probe_vocab
    elif corpus is not None:
        low, high = corpus.first_ordinary, corpus.vocab_size
    else:
        raise UserError("bif_over_checkpoints needs probe_vocab when corpus is None")
    probe = repeated_random_tokens(32, half, low, high, seed=(corpus.seed if corpus else 0) + 77)
    check_claims(claims, train, query)
    reference_loss = unigram_loss(posterior)  # a model that knows token frequencies and nothing else
    rows: list[dict[str, Any]] = []
    claim_table: list[dict[str, Any]] = []
    summary = []
    for index, ref in enumerate(progress_bar(refs, desc="checkpoints", disable=not progress)):
        model = ref.load()
        if corpus is not None and getattr(model.cfg, "d_vocab", corpus.vocab_size) < corpus.vocab_size:
            raise UserError(f"checkpoint {ref.label} has vocabulary {model.cfg.d_vocab} < corpus vocabulary "
                            f"{corpus.vocab_size}")
        heads = induction_scores(model, probe, half)
        score = float(heads.max())

        sampler, localization = config.sampler, None
        if localize.auto:
            localization = local_gamma(model, posterior, sequence_loss, reference_loss=reference_loss,
                                       reference=UNIGRAM, config=localize, param_patterns=sampler.param_patterns,
                                       seed=sampler.seed, eval_batch_size=sampler.eval_batch_size,
                                       n_beta=sampler.resolved_n_beta(int(posterior.shape[0])))
            notice(f"{ref.label}: localization: {localization.describe()}")
            sampler = localized_sampler(sampler, localization)

        def one_round(sampler: Any, model: Any = model, ref: Any = ref) -> Any:
            return lm_bif(model, posterior, train, query, dataclasses.replace(config, sampler=sampler),
                          cache_dir=rounds_dir, cache_identity=ref.identity(), reference_loss=reference_loss,
                          reference=UNIGRAM, advice=advice_for("bif-lm"))

        result, record = until_converged(one_round, sampler, adaptive, on_round=round_notice,
                                         local_backoff=localize.auto)
        verdict = result.verdict
        climb = result.locality.worst_climb if result.locality is not None else float("nan")
        if rounds_dir != out:
            keep_final_round(rounds_dir, out, f"lm_bif_{result.cache_key}")
        step = ref.step if ref.step is not None else index
        if claims:
            claim_table.extend(claim_rows(claim_influences(result, claims), step=step, seed=training_seed,
                                          induction_score=score, locality=result.locality))
        for name, red in result.reductions.items():
            if "token" in name:
                continue  # the full matrix stays in the cached safetensors, not in the table
            for i, row_label in enumerate(red.row_labels):
                for j, col_label in enumerate(red.col_labels):
                    rows.append({"step": step, "checkpoint": ref.label, "induction_score": score, "reduction": name,
                                 "train_group": row_label, "query_group": col_label,
                                 "bif": float(red.bif[i, j]), "stderr": float(red.stderr[i, j]),
                                 "verdict": verdict, "climb": climb})
        summary.append(
            {
                "step": step, "checkpoint": ref.label, "induction_score": score,
                "induction_scores_per_head": heads.tolist(), "result_dir": str(out / f"lm_bif_{result.cache_key}"),
                "query_mean_loss": float(result.query_mean_loss.mean()),
                "convergence": result.convergence.summary() if result.convergence is not None else None,
                "adaptive": record.to_dict(), "verdict": record.describe(), "sampling_verdict": verdict,
                "locality": result.locality.to_dict() if result.locality is not None else None,
                "localization": localization.to_dict() if localization is not None else None,
                "sampler_warnings": result.diagnostics.warnings if result.diagnostics else [],
            }
        )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "per_class.csv", buffer.getvalue())
    converged = {int(entry["step"]): bool((entry["convergence"] or {}).get("converged", False)) for entry in summary}
    save_figure(plot_per_class(rows, pearson=config.sampler.pearson, converged=converged),
                out / f"per_class.{figure_format}")
    if claims:
        write_claims_csv(claim_table, out / "claims.csv")
        write_claim_figures(claim_table, out, figure_format)
    atomic_write_json(out / "summary.json", {"config": config.to_dict(), "corpus": corpus.to_dict() if corpus else None,
                                             "n_posterior": n_posterior, "n_train": n_train, "n_query": n_query,
                                             "checkpoints": summary})
    return rows


def check_claims(claims: Sequence[str], train: TokenSet, query: TokenSet) -> None:
    """Refuse a malformed claim, or one naming a class absent from the recorded training /
    query tokens, before any sampling.

    Raises:
        UserError: Names the claim and the classes there are.
    """
    from interp_toolkit.analyses.bif.claims import check_claim_classes, parse_claim
    from interp_toolkit.analyses.bif.lm_tokens import group_ids

    train_classes, query_classes = group_ids(train, "class")[1], group_ids(query, "class")[1]
    for claim in claims:
        try:
            for pair in parse_claim(claim):
                if pair is not None:
                    check_claim_classes(claim, pair, train_classes, query_classes)
        except (ValueError, UserError) as err:
            raise UserError(str(err)) from err


def default_claims(train: TokenSet, query: TokenSet) -> tuple[str, ...]:
    """The claims of :data:`~interp_toolkit.analyses.bif.claims.DEFAULT_CLAIMS` whose classes
    the recorded tokens have."""
    from interp_toolkit.analyses.bif.claims import DEFAULT_CLAIMS

    out = []
    for claim in DEFAULT_CLAIMS:
        try:
            check_claims([claim], train, query)
        except UserError:
            continue
        out.append(claim)
    return tuple(out)


def plot_per_class(rows: Sequence[dict[str, Any]], ax: Any = None, pearson: bool = False,
                   converged: Mapping[int, bool] | None = None) -> Any:
    """Per-class BIF on the mean query loss over checkpoints (+-stderr), induction score on
    a twin axis; x is the training step on a symlog axis (log-spaced early checkpoints,
    linear later ones).

    Args:
        rows: Rows of ``per_class.csv``.
        ax: Optional axes to draw into (the twin axis is added beside it).
        pearson: Label the y axis as a correlation.
        converged: Step -> whether that checkpoint's chains passed the R-hat / ESS rule;
            the estimates of a checkpoint that did not are drawn hollow and named in the legend.

    Returns:
        The :class:`matplotlib.figure.Figure` drawn on.
    """
    from interp_toolkit.plotting import component_colors, new_figure, style
    from interp_toolkit.tasks.induction_corpus import CLASS_NAMES

    sel = [r for r in rows if r["reduction"] == "class:all"]
    classes = [c for c in CLASS_NAMES if any(r["train_group"] == c for r in sel)] + sorted(
        {r["train_group"] for r in sel} - set(CLASS_NAMES))
    colors = component_colors(classes)
    with style():
        fig, ax = new_figure(ax, figsize=(8, 4.5))
        for cls in classes:
            pts = sorted((r["step"], r["bif"], r["stderr"]) for r in sel if r["train_group"] == cls)
            steps = [p[0] for p in pts]
            vals = [p[1] for p in pts]
            errs = [0.0 if math.isnan(p[2]) else p[2] for p in pts]
            ax.plot(steps, vals, marker="o", ms=3, label=f"train {cls} tokens", color=colors[cls])
            ax.fill_between(steps, [v - e for v, e in zip(vals, errs)], [v + e for v, e in zip(vals, errs)],
                            alpha=0.2, color=colors[cls])
            bad = [i for i, step in enumerate(steps) if converged is not None and not converged.get(step, True)]
            if bad:
                ax.plot([steps[i] for i in bad], [vals[i] for i in bad], ls="none", marker="o", ms=6, mfc="white",
                        mec=colors[cls], mew=1.2)
        if converged is not None and not all(converged.values()):
            ax.plot([], [], ls="none", marker="o", ms=6, mfc="white", mec="gray", mew=1.2,
                    label="not converged (R-hat > 1.01 or ESS < 100)")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("training step (log scale)")
        ax.set_ylabel("-Corr" if pearson else "BIF = -Cov (class mean loss, query mean loss)")
        twin = ax.twinx()
        ind = sorted({(r["step"], r["induction_score"]) for r in sel})
        twin.plot([p[0] for p in ind], [p[1] for p in ind], color="k", ls="--", lw=1.5, label="induction score")
        twin.set_ylabel("induction score (max head)")
        twin.set_ylim(0, 1)
        twin.grid(False)
        lines, labels = ax.get_legend_handles_labels()
        lines2, labels2 = twin.get_legend_handles_labels()
        # right of the data, clear of the twin axis's label
        ax.legend(lines + lines2, labels + labels2, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0,
                  fontsize="small")
        ax.set_title("Token-level BIF per training-token class over checkpoints")
    return fig


def _testbed_config(refs: Sequence[CheckpointRef]) -> dict[str, Any] | None:
    """The ``config`` of the testbed run whose ``testbed.json`` sits at or up to three folders
    above a local checkpoint of ``refs``; None when there is none (hub checkpoints, real text)."""
    from interp_toolkit.studies.lm.testbed import (
        TESTBED_JSON,  # lm_testbed imports torch: not at start-up
    )

    for ref in refs:
        if ref.kind == "hub":
            continue
        for folder in list(Path(ref.location).parents)[:3]:
            record = folder / TESTBED_JSON
            if record.is_file():
                return dict(json.loads(record.read_text())["config"])
    return None


def testbed_corpus(refs: Sequence[CheckpointRef]) -> CorpusConfig | None:
    """The corpus config of the testbed the checkpoints came from (its ``testbed.json``), or None."""
    from interp_toolkit.tasks.induction_corpus import CorpusConfig

    config = _testbed_config(refs)
    return CorpusConfig.from_dict(config["corpus"]) if config is not None else None


def testbed_seed(refs: Sequence[CheckpointRef]) -> int:
    """The training seed of the testbed the checkpoints came from (0 when unknown)."""
    config = _testbed_config(refs)
    return int(config.get("seed", 0)) if config is not None else 0


def sequence_loss(model: Any, tokens: Any) -> Any:
    """Per-sequence mean next-token loss: a BIF ``loss_fn`` whose mean over the posterior
    sequences is the posterior loss :func:`~interp_toolkit.analyses.bif.lm.lm_bif` samples."""
    from interp_toolkit.analyses.bif.lm_tokens import next_token_losses

    return next_token_losses(model, tokens).mean(1)


def calibrate_lm_checkpoint(ref: Any, sets: Any, sampler: SamplerConfig, out: str | Path, *,
                            sizes: tuple[int, int, int], eps: Sequence[float] = (), gamma: Sequence[float] = (),
                            n_beta: Sequence[float] = (), figure_format: str = "png",
                            localize: LocalizeConfig | None = None) -> dict[str, Any]:
    """The sampler calibration sweep of ``bif-lm --calibrate`` at checkpoint ``ref``: the same
    posterior as the series (``calibrate_sampler`` with :func:`sequence_loss`), the recorded
    training sequences as rows and the query sequences as columns; ``eps`` x ``gamma``
    (x ``n_beta``) around ``sampler`` (defaults: eps / 10, eps, eps * 10; its gamma; its
    n_beta). ``sets`` is ``(posterior tokens, train, query)`` of ``sizes`` (n_posterior,
    n_train, n_query: part of the file's key). Writes ``OUT/calibration_<key>.json`` and its
    figure; returns the JSON plus ``path``. Every setting is gated for locality against the
    unigram loss of the posterior tokens; with ``localize`` (default: derived, as the series does)
    the sweep centres on the checkpoint's derived gamma and eps."""
    from interp_toolkit.analyses.bif.calibration import calibrate_sampler, plot_calibration
    from interp_toolkit.io import config_hash
    from interp_toolkit.plotting import check_format, save_figure

    figure_format = check_format(figure_format)  # a bad format is refused before the sweep
    from interp_toolkit.analyses.bif.diagnostics import advice_for
    from interp_toolkit.analyses.bif.locality import unigram_loss
    from interp_toolkit.analyses.bif.localize import local_gamma, localized_sampler

    posterior, train, query = sets
    localize = LocalizeConfig() if localize is None else localize
    model = ref.load()
    reference_loss = unigram_loss(posterior)
    base, localization = sampler, None
    if localize.auto:
        localization = local_gamma(model, posterior, sequence_loss, reference_loss=reference_loss, reference=UNIGRAM,
                                   config=localize, param_patterns=sampler.param_patterns, seed=sampler.seed,
                                   eval_batch_size=sampler.eval_batch_size,
                                   n_beta=sampler.resolved_n_beta(int(posterior.shape[0])))
        base = localized_sampler(sampler, localization)
    gamma, n_beta = tuple(gamma), tuple(n_beta)
    eps = tuple(eps) or (base.eps / 10, base.eps, base.eps * 10)
    calibration = calibrate_sampler(model, posterior, query.tokens, sequence_loss, base, eps=eps,
                                    gamma=gamma or None, n_beta=n_beta or None, attribution_data=train.tokens,
                                    reference_loss=reference_loss, reference=UNIGRAM, advice=advice_for("bif-lm"))
    report = {"checkpoint": ref.label, **calibration.to_dict(),
              "localization": None if localization is None else localization.to_dict()}
    key = config_hash({"checkpoint": ref.identity(), "eps": list(eps), "gamma": list(gamma),
                       "n_beta": list(n_beta), "sampler": base.to_dict(), "sets": list(sizes)}, 10)
    path = Path(out) / f"calibration_{key}.json"
    atomic_write_json(path, report)
    save_figure(plot_calibration(calibration), Path(out) / f"calibration_{key}", figure_format)
    return {**report, "path": str(path)}
