"""The hierarchy re-measurement's stages in the package (studies/bif/remeasure*.py): replicas,
resumable sampling, the stored draws read back, and the claims' figure redrawn from the
committed summary."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from interp_toolkit.studies.bif.remeasure import STEPS, load_draws, replicas, sample
from interp_toolkit.tasks.dln import DeepLinearNetwork, DLNConfig
from interp_toolkit.tasks.hierarchical import animals_and_plants

ROOT = Path(__file__).resolve().parents[3]


def test_replicas_are_the_gd_run_of_each_init_at_each_step():
    data = animals_and_plants()
    W1, W2, labels = replicas(data, inits=(0, 3), steps=(0, 5, 40))
    assert labels == [(0, 0), (0, 5), (0, 40), (3, 0), (3, 5), (3, 40)]
    assert W1.shape == (6, 16, data.n_items) and W2.shape == (6, data.n_properties, 16)
    start = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=3))
    assert torch.equal(W1[3], start.W1.weight.detach()) and torch.equal(W2[3], start.W2.weight.detach())
    assert not torch.equal(W1[4], W1[3])  # trained


def test_sampling_resumes_per_seed_and_the_draws_read_back(tmp_path, capsys):
    sample(tmp_path, 1.6e-3, seeds=(0,), burn_in=2, draws=4, every=1, inits=(0,))
    (first,) = tmp_path.glob("draws_seed0.safetensors")
    stamp = first.stat().st_mtime_ns
    sample(tmp_path, 1.6e-3, seeds=(0,), burn_in=2, draws=4, every=1, inits=(0,))
    assert "seed 0:" in capsys.readouterr().out and first.stat().st_mtime_ns == stamp  # skipped, not redone
    losses, distance, meta = load_draws(tmp_path, seeds=(0,))
    n_items = animals_and_plants().n_items
    assert losses.shape == (1, 4, 4, len(STEPS), n_items) and distance.shape == (1, 4, 4, len(STEPS))
    assert torch.isfinite(losses).all() and (losses >= 0).all()
    assert meta["labels"] == [[0, step] for step in STEPS] and meta["sampler"]["eps"] == 1.6e-3


def test_replot_draws_the_claims_from_a_committed_summary(tmp_path):
    from interp_toolkit.studies.bif.remeasure_plot import replot

    shutil.copy(ROOT / "docs" / "bif" / "ladder" / "eps1.6e-3" / "remeasure_summary.json", tmp_path)
    replot(tmp_path)
    assert (tmp_path / "remeasure.png").stat().st_size > 50_000
