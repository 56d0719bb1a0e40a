"""The language-model claims on the testbed as a study: class-to-class influence across
checkpoints, dense through the induction transition, for several training seeds (resumable).
``examples/lm_bif_claims.py`` is its command line (stages cost, calibrate, run, report).

Every piece is cached: a testbed run by its config hash (``<out>/seed<S>/testbed``), each
checkpoint's BIF by config, data and checkpoint (``<out>/seed<S>/bif/lm_bif_<hash>``), so an
interrupted :func:`run_claims` continues where it stopped; ``<out>/seed<S>/claims.csv`` is
rewritten after every checkpoint (:func:`report_claims` merges the seeds). Checkpoints are
done in priority order: the transition window of seed 0 first, then its coarse grid, then the
other seeds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.claims import DEFAULT_CLAIMS, claim_influences
from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
from interp_toolkit.analyses.induction import induction_score
from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.lm.claims import (
    CLAIMS_STUDY_JSON,
    claim_peaks,
    claim_rows,
    read_claims_csv,
    rise_and_fall,
    sign_change,
    write_claim_figures,
    write_claims_csv,
)
from interp_toolkit.studies.lm.series import corpus_sets
from interp_toolkit.studies.lm.testbed import (
    TESTBED_JSON,
    TestbedConfig,
    induction_phases,
    train_testbed,
)
from interp_toolkit.tasks.induction_corpus import CorpusConfig, repeated_random_tokens

#: Beside a seed's claims.csv: the settings its rows were measured with.
CLAIMS_CONFIG_JSON = "claims_config.json"

#: Posterior, attribution (train) and query sequences drawn from the testbed's corpus.
SIZES = {"n_posterior": 512, "n_train": 16, "n_query": 16}


@dataclass
class ClaimsStudyConfig:
    """Settings of the claims study (the command line's flags, same names).

    Attributes:
        out: The study folder (testbeds, BIF caches, per-seed claims.csv, calibration.json).
        seeds: Training seeds of the testbed.
        chains, draws, burn_in: SGLD chains per checkpoint, draws kept and burn-in steps per chain.
        eps, gamma: SGLD step size and localization; None: calibration.json's recommendation,
            else 1e-4 and 100.
        coarse: Measure every this many steps outside the transition window.
        steps: Only these checkpoint steps, in this order (None: the transition first, then coarse).
        total_steps: The testbed's training steps (1,000: the committed study; longer to see
            past the induction peak).
        checkpoint_every: The testbed's linear checkpoint spacing (log-spaced below it; 25 in the
            committed study; a long testbed needs fewer).
        cost_draws: Draws (and burn-in) of the cost and calibration runs.
        calibrate_eps, calibrate_gamma: The calibration grid.
    """

    out: Path = Path("runs/lm_bif_claims")
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    chains: int = 8
    draws: int = 200
    burn_in: int = 200
    eps: float | None = None
    gamma: float | None = None
    coarse: int = 100
    steps: list[int] | None = None
    total_steps: int = 1000
    checkpoint_every: int = 25
    cost_draws: int = 10
    calibrate_eps: list[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3])
    calibrate_gamma: list[float] = field(default_factory=lambda: [100.0, 300.0])

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        for name, low in (("chains", 2), ("draws", 2), ("burn_in", 0), ("coarse", 1), ("total_steps", 1),
                          ("checkpoint_every", 1), ("cost_draws", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(f"ClaimsStudyConfig.{name} must be an integer >= {low}, got {value!r}")
        for name in ("seeds", "steps"):
            values = getattr(self, name)
            if values is not None and (not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                                         for v in values)):
                raise UserError(f"ClaimsStudyConfig.{name} must be a non-empty list of integers >= 0, got {values!r}")
        for name in ("eps", "gamma"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise UserError(f"ClaimsStudyConfig.{name} must be a positive finite number or None, got {value!r}")


def testbed_config(seed: int, total_steps: int = 1000, checkpoint_every: int = 25) -> TestbedConfig:
    """The claims testbed: the calibrated corpus (64 ordinary tokens), lr 3e-3 (an abrupt
    transition around step 400 in the calibration), ``total_steps`` steps (1,000 in the
    committed study; the cosine decay spans them, so a longer testbed is a new one), a
    checkpoint every ``checkpoint_every`` (25 in the committed study)."""
    corpus = CorpusConfig(n_sequences=2048, seq_len=48, n_ordinary=64, chunk_min=10, chunk_max=20)
    return TestbedConfig(corpus=corpus, total_steps=total_steps, linear_every=checkpoint_every, batch_size=64,
                         lr=3e-3, seed=seed)


def sampler_config(args: ClaimsStudyConfig) -> SamplerConfig:
    """``eps`` / ``gamma`` if given, else the calibration's recommendation
    (``<out>/calibration.json``), else eps 1e-4, gamma 100."""
    eps, gamma = args.eps, args.gamma
    record = args.out / "calibration.json"
    if record.is_file() and (eps is None or gamma is None):
        setting = json.loads(record.read_text())["recommended_setting"] or {}
        eps = eps if eps is not None else setting.get("eps")
        gamma = gamma if gamma is not None else setting.get("gamma")
    return SamplerConfig(eps=eps if eps is not None else 1e-4, gamma=gamma if gamma is not None else 100.0,
                         n_beta=30.0, chains=args.chains, draws=args.draws, burn_in=args.burn_in, batch_size=16,
                         progress=False, seed=0)


def induction_scores_by_step(refs: list[Any], corpus: CorpusConfig, cache: Path) -> dict[int, float]:
    """Max-head induction score of every checkpoint (cached in ``cache``)."""
    scores = {int(k): v for k, v in json.loads(cache.read_text()).items()} if cache.is_file() else {}
    half = (corpus.seq_len - 1) // 2
    probe = repeated_random_tokens(32, half, corpus.first_ordinary, corpus.vocab_size, seed=corpus.seed + 77)
    for ref in refs:
        if ref.step not in scores:
            scores[ref.step] = induction_score(ref.load(), probe, half)
    atomic_write_json(cache, {str(k): v for k, v in sorted(scores.items())})
    return scores


def prioritized(refs: list[Any], scores: dict[int, float], coarse: int) -> list[Any]:
    """Every checkpoint of the transition window (10%-90% of the rise, widened by 50 steps
    each side) first, from the formation step outward (nearest first, earlier on ties), then
    every ``coarse`` steps and the last one, in step order."""
    steps = sorted(scores)
    phases = induction_phases(steps, [scores[s] for s in steps])
    start, end = (phases["start"] or 0) - 50, (phases["end"] or 0) + 50
    formation = phases["formation_step"]
    dense = sorted((r for r in refs if start <= r.step <= end), key=lambda r: (abs(r.step - formation), r.step))
    rest = [r for r in refs if r not in dense and (r.step % coarse == 0 or r.step == refs[-1].step)]
    return dense + rest


def _settings(config: LMBIFConfig) -> dict[str, Any]:
    return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def earlier_rows(seed_dir: Path, config: LMBIFConfig) -> list[dict[str, Any]]:
    """The rows of ``seed_dir/claims.csv`` if they were measured with ``config`` (recorded in
    ``claims_config.json`` beside it by :func:`write_seed_rows`), else none. So a run on some
    steps keeps the steps an earlier run of the same settings measured."""
    record = seed_dir / CLAIMS_CONFIG_JSON
    same = record.is_file() and json.loads(record.read_text()) == _settings(config)
    return read_claims_csv(seed_dir / "claims.csv") if same and (seed_dir / "claims.csv").is_file() else []


def write_seed_rows(seed_dir: Path, config: LMBIFConfig, rows: list[dict[str, Any]]) -> None:
    """``seed_dir/claims.csv`` and, beside it, the settings its rows were measured with."""
    write_claims_csv(rows, seed_dir / "claims.csv")
    atomic_write_json(seed_dir / CLAIMS_CONFIG_JSON, _settings(config))


def run_claims(args: ClaimsStudyConfig) -> None:
    """Train each seed's testbed (cached) and measure the claims at its checkpoints in
    priority order (:func:`prioritized`, or ``args.steps`` in their order), rewriting
    ``<out>/seed<S>/claims.csv`` after every checkpoint. Steps off the schedule are refused
    before any work."""
    config = LMBIFConfig(sampler_config(args), reductions=("class:class", "class:all"))
    planned = testbed_config(
        0, args.total_steps, args.checkpoint_every
    ).checkpoint_steps  # the same schedule for every seed
    missing = [step for step in args.steps or () if step not in planned]
    if missing:
        raise UserError(f"--steps {missing}: the testbed has no checkpoint there (it has {planned[:4]} ... "
                        f"{planned[-2:]}, every {planned[-1] - planned[-2]} steps)")
    print(f"sampler: {config.sampler.to_dict()}", flush=True)
    for seed in args.seeds:
        rows = earlier_rows(args.out / f"seed{seed}", config)
        testbed = testbed_config(seed, args.total_steps, args.checkpoint_every)
        started = time.process_time()
        refs = train_testbed(testbed, args.out / f"seed{seed}" / "testbed", progress=False)
        print(f"seed {seed}: testbed ready ({len(refs)} checkpoints, {time.process_time() - started:.0f} CPU s)",
              flush=True)
        scores = induction_scores_by_step(refs, testbed.corpus, args.out / f"seed{seed}" / "induction_scores.json")
        posterior, train, query = corpus_sets(testbed.corpus, **SIZES)
        by_step = {ref.step: ref for ref in refs}
        order = [by_step[step] for step in args.steps] if args.steps else prioritized(refs, scores, args.coarse)
        for ref in order:
            assert ref.step is not None  # testbed checkpoints are named by step
            started = time.process_time()
            result = lm_bif(ref.load(), posterior, train, query, config, cache_dir=args.out / f"seed{seed}" / "bif",
                            cache_identity=ref.identity())
            rows = [row for row in rows if row["step"] != ref.step]
            rows += claim_rows(claim_influences(result, DEFAULT_CLAIMS), step=ref.step, seed=seed,
                               induction_score=scores[ref.step])
            write_seed_rows(args.out / f"seed{seed}", config, rows)
            print(f"seed {seed} step {ref.step}: {time.process_time() - started:.0f} CPU s", flush=True)


def claims_cost(args: ClaimsStudyConfig) -> dict[str, Any]:
    """CPU seconds per SGLD step and per recorded draw, from a short run at the given chains,
    extrapolated to ``draws`` and ``burn_in`` (the model's weights do not change the cost)."""
    from interp_toolkit.sources import resolve_checkpoints
    from interp_toolkit.studies.lm.testbed import testbed_model

    testbed = testbed_config(0, args.total_steps, args.checkpoint_every)
    init = args.out / "cost_model" / "step000000"  # loaded as every checkpoint is (a TransformerBridge)
    if not init.is_dir():
        testbed_model(testbed).save_pretrained(init)
    model = resolve_checkpoints([init])[0].load()
    posterior, train, query = corpus_sets(testbed.corpus, **SIZES)
    short = dataclasses.replace(args, draws=args.cost_draws, burn_in=args.cost_draws)
    config = LMBIFConfig(sampler_config(short), reductions=("class:class", "class:all"))
    started = time.process_time()
    lm_bif(model, posterior, train, query, config)
    seconds = time.process_time() - started
    per_step = seconds / (args.chains * 2 * args.cost_draws)  # mean over burn-in and draw steps (equal numbers)
    full_steps = args.chains * (args.burn_in + args.draws)
    return {"chains": args.chains, "short_run_steps": args.chains * 2 * args.cost_draws,
            "short_run_cpu_s": round(seconds, 1), "cpu_s_per_step": round(per_step, 4),
            "full_steps": full_steps, "full_checkpoint_cpu_s": round(per_step * full_steps)}


def calibrate_claims(args: ClaimsStudyConfig) -> str:
    """eps x gamma sweep (n_beta 30 fixed) at seed 0's formation checkpoint with the
    calibration helper (which prefers the base gamma 100, so the posterior stays the same
    unless no setting there is usable); writes ``<out>/calibration.json``, which
    :func:`run_claims` reads; returns the calibration's reason."""
    from interp_toolkit.analyses.bif import calibrate_sampler
    from interp_toolkit.analyses.bif.lm_tokens import next_token_losses

    testbed = testbed_config(0, args.total_steps, args.checkpoint_every)
    refs = train_testbed(testbed, args.out / "seed0" / "testbed", progress=False)
    scores = induction_scores_by_step(refs, testbed.corpus, args.out / "seed0" / "induction_scores.json")
    steps = sorted(scores)
    formation = induction_phases(steps, [scores[s] for s in steps])["formation_step"]
    ref = next(r for r in refs if r.step == formation)
    posterior, train, query = corpus_sets(testbed.corpus, **SIZES)
    base = SamplerConfig(eps=1e-4, gamma=100.0, n_beta=30.0, chains=4, draws=args.cost_draws,
                         burn_in=args.cost_draws, batch_size=16, progress=False)
    calibration = calibrate_sampler(ref.load(), posterior, query.tokens, next_token_losses, base,
                                    eps=args.calibrate_eps, gamma=args.calibrate_gamma,
                                    attribution_data=train.tokens)
    atomic_write_json(args.out / "calibration.json", {"step": formation, **calibration.to_dict()})
    return calibration.reason


def study_settings(out: Path) -> dict[str, Any]:
    """What the verdict engine names a study by: the testbed's training steps and checkpoint
    spacing (``seed*/testbed/testbed.json``) and the sampler (``seed*/claims_config.json``),
    each the same for every seed.

    Raises:
        UserError: if the seeds were measured with different testbeds or samplers.
    """
    found: dict[str, set[str]] = {"testbed": set(), "sampler": set()}
    for seed_dir in sorted(out.glob("seed*")):
        testbed, measured = seed_dir / "testbed" / TESTBED_JSON, seed_dir / CLAIMS_CONFIG_JSON
        if testbed.is_file():
            config = json.loads(testbed.read_text())["config"]
            found["testbed"].add(json.dumps({k: config[k] for k in ("total_steps", "linear_every")}))
        if measured.is_file():
            sampler = json.loads(measured.read_text())["sampler"]
            found["sampler"].add(json.dumps({k: sampler[k] for k in ("chains", "draws", "burn_in", "eps", "gamma")}))
    for name, values in found.items():
        if len(values) != 1:
            raise UserError(f"{out}: the seeds' {name} settings differ or are missing ({sorted(values)}); report "
                            f"one study per setting")
    testbed = json.loads(found["testbed"].pop())
    return {"total_steps": testbed["total_steps"], "checkpoint_every": testbed["linear_every"],
            "sampler": json.loads(found["sampler"].pop())}


def report_claims(out: Path, docs: Path) -> dict[str, Any]:
    """Merge every ``<out>/seed*/claims.csv`` into ``docs/claims.csv``, draw one figure per claim
    and write ``docs/verdicts.json`` (peaks, rise and fall, sign change per series); prints
    each figure's path and each verdict; returns the verdicts."""
    found = sorted(out.glob("seed*/claims.csv"))
    if not found:
        raise UserError(f"--out {out} holds no seed*/claims.csv to report; run --stage run --out {out} "
                        f"first")
    rows = [row for path in found for row in read_claims_csv(path)]
    settings = study_settings(out)  # refused before anything is written
    docs.mkdir(parents=True, exist_ok=True)
    write_claims_csv(rows, docs / "claims.csv")
    atomic_write_json(docs / CLAIMS_STUDY_JSON, settings)
    for path in write_claim_figures(rows, docs):
        print(path)
    verdicts: dict[str, Any] = {}
    for series in dict.fromkeys(r["series"] for r in rows):
        verdicts[series] = {"peaks": claim_peaks(rows, series), "rise_and_fall": rise_and_fall(rows, series),
                            "sign_change": sign_change(rows, series)}
        for peak in verdicts[series]["peaks"]:
            print(series, json.dumps(peak))
    for series, found in verdicts.items():
        for r in found["rise_and_fall"]:
            print(f"{series} seed {r['seed']}: {r['verdict']} (peak {r['peak_bif']:+.2e} at step {r['peak_step']}; "
                  f"rise {r['rise']:+.2e} +- {r['rise_stderr']:.1e}, z {r['rise_z']:.1f}; "
                  f"fall {r['fall']:+.2e} +- {r['fall_stderr']:.1e}, z {r['fall_z']:.1f})")
        for r in found["sign_change"]:
            print(f"{series} seed {r['seed']}: {r['verdict']} {r['order']} (max z {r['max_z']:+.1f} at step "
                  f"{r['max_step']}, min z {r['min_z']:+.1f} at step {r['min_step']})")
    atomic_write_json(docs / "verdicts.json", verdicts)
    return verdicts
