"""The re-measurement example's batched SGLD (examples/bif_hierarchy_remeasure.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.tasks.hierarchical import animals_and_plants

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import bif_hierarchy_remeasure as remeasure  # noqa: E402

torch.set_num_threads(1)


def test_batched_sgld_uses_the_dln_gradient_and_the_library_update():
    data = animals_and_plants()
    X, Y = data.inputs.float(), data.targets.float()
    W1, W2, labels = remeasure.replicas(data, inits=(0, 1), steps=(0, 300))
    assert labels == [(0, 0), (0, 300), (1, 0), (1, 300)] and W1.shape == (4, 16, 8)
    remeasure.check_gradients(W1[1:], W2[1:], X, Y)  # closed form == autograd on DeepLinearNetwork
    config = SamplerConfig(eps=2e-5, gamma=100.0, n_beta=400.0, chains=2, draws=30, burn_in=10,
                           steps_between_draws=2, seed=3, progress=False)
    first = remeasure.sgld_chains(W1, W2, X, Y, config)
    again = remeasure.sgld_chains(W1, W2, X, Y, config)
    assert first["losses"].shape == (2, 30, 4, 8) and torch.equal(first["losses"], again["losses"])
    # every chain starts at w* (distance 0) and moves off it; chains differ
    assert float(first["distance_trace"][:, 0].abs().max()) == 0.0 and float(first["distance"].min()) > 0
    assert not torch.equal(first["losses"][0], first["losses"][1])
    # one SGLD step from w* with the noise switched off is the gradient step of the library's rule
    quiet = SamplerConfig(eps=1e-30, gamma=100.0, n_beta=1e25, chains=1, draws=1, burn_in=0, progress=False)
    stepped = remeasure.sgld_chains(W1[1:2], W2[1:2], X, Y, quiet)["losses"][0, 0, 0]
    _, g2, g1 = remeasure.closed_form_gradients(W1[1:2], W2[1:2], X, Y)
    W1n, W2n = W1[1:2] - 0.5e-5 * g1, W2[1:2] - 0.5e-5 * g2  # eps/2 * n_beta = 5e-6
    expected = 0.5 * (X @ (W2n @ W1n).transpose(-1, -2) - Y).pow(2).sum(-1)[0]
    torch.testing.assert_close(stepped, expected, rtol=1e-4, atol=1e-6)
