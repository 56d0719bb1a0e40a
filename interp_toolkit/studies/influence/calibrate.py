"""``interp-toolkit influence --calibrate``: the sampler calibration sweep on the study's own
posterior at the first checkpoint it would measure, every setting gated for locality."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from interp_toolkit.analyses.bif.config import SamplerConfig
from interp_toolkit.errors import UserError
from interp_toolkit.studies.influence.measure import (
    InfluenceConfig,
    attribution_rows,
    influence_output_dir,
    selected_checkpoints,
)

__all__ = ["calibrate_influence"]


def calibrate_influence(run_dir: str | Path | None, config: InfluenceConfig | None = None, *,
                        eps: Sequence[float] = (), gamma: Sequence[float] = (), n_beta: Sequence[float] = (),
                        out: str | Path | None = None, device: str = "cpu", format: str = "png") -> dict[str, Any]:
    """The sampler calibration sweep of ``interp-toolkit influence --calibrate``, at the first
    checkpoint the study would measure: the study's posterior (the run's whole training split,
    readout cross-entropy), its scored training rows as the attribution set and its adversarial
    query examples' losses as the observables; ``eps`` x ``gamma`` (x ``n_beta``) around the
    study's sampler (derived per checkpoint with ``config.localize.auto``; defaults: eps / 10,
    eps, eps * 10; its gamma; its n_beta), every setting gated for locality against the
    label-marginal loss (a non-local one is never recommended). Writes
    ``OUT/calibration_<key>.json`` and its figure; returns the JSON plus ``path``.

    Raises:
        UserError: As :func:`run_influence`, before any sampling.
    """
    from interp_toolkit.analyses.bif.calibration import calibrate_sampler, plot_calibration
    from interp_toolkit.analyses.bif.diagnostics import advice_for
    from interp_toolkit.analyses.bif.locality import label_marginal_loss
    from interp_toolkit.analyses.bif.localize import local_gamma, localized_sampler
    from interp_toolkit.analyses.over_checkpoints import splits_from_run
    from interp_toolkit.checkpoint import load_checkpoint
    from interp_toolkit.devices import resolve_device
    from interp_toolkit.io import atomic_write_json, config_hash, file_digest
    from interp_toolkit.plotting import check_format, save_figure
    from interp_toolkit.studies.bif.checkpoint import readout_correct, readout_example_loss

    format = check_format(format)
    if run_dir is None or not Path(run_dir).is_dir():
        raise UserError(f"run directory {run_dir} does not exist (expected an MPSP run directory)")
    config = config if config is not None else InfluenceConfig()
    run_dir = Path(run_dir)
    epoch, path = selected_checkpoints(run_dir, config)[0]
    splits = splits_from_run(run_dir)
    if "train" not in splits or "adv" not in splits or getattr(splits["train"], "agrees", None) is None:
        raise UserError(f"the task of {run_dir} needs splits train and adv and train.agrees for the influence study")
    device = str(resolve_device(device or "cpu"))
    model, _ = load_checkpoint(path, device=device)
    train, adv = splits["train"], splits["adv"]
    posterior = (train.tokens.to(device), train.labels.to(device))
    rows = attribution_rows(train.agrees, config.n_consistent, config.sampler.seed)
    scored = (train.tokens[rows].to(device), train.labels[rows].to(device))
    query = (adv.tokens[: config.n_query].to(device), adv.labels[: config.n_query].to(device))
    reference, reference_loss = "label-marginal cross-entropy", label_marginal_loss(train.labels)
    base = config.sampler
    if base.batch_size is not None and base.batch_size > len(train):
        base = SamplerConfig.from_dict({**base.to_dict(), "batch_size": None})
    localization = None
    if config.localize.auto:
        localization = local_gamma(model, posterior, readout_example_loss, reference_loss=reference_loss,
                                   reference=reference, config=config.localize, param_patterns=base.param_patterns,
                                   seed=base.seed, eval_batch_size=base.eval_batch_size,
                                   n_beta=base.resolved_n_beta(len(train)))
        base = localized_sampler(base, localization)
    eps = tuple(eps) or (base.eps / 10, base.eps, base.eps * 10)
    calibration = calibrate_sampler(model, posterior, query, readout_example_loss, base, eps=eps,
                                    gamma=tuple(gamma) or None, n_beta=tuple(n_beta) or None,
                                    attribution_data=scored, reference_loss=reference_loss, reference=reference,
                                    accuracy_fn=readout_correct, advice=advice_for("influence"))
    report = {"run_dir": str(run_dir), "epoch": epoch, "checkpoint": str(path), **calibration.to_dict(),
              "localization": None if localization is None else localization.to_dict()}
    key = config_hash({"checkpoint": file_digest(path), "eps": list(eps), "gamma": list(gamma),
                       "n_beta": list(n_beta), "sampler": base.to_dict(), "n_query": config.n_query,
                       "n_consistent": config.n_consistent}, 10)
    out_dir = influence_output_dir(run_dir, out)
    target = out_dir / f"calibration_{key}.json"
    atomic_write_json(target, report)
    save_figure(plot_calibration(calibration), out_dir / f"calibration_{key}", format)
    return {**report, "path": str(target)}
