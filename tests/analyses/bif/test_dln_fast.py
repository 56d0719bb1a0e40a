"""The batched DLN SGLD (analyses/bif/dln_fast.py) against the library's sampler and autograd."""

from __future__ import annotations

import pytest
import torch

from interp_toolkit.analyses.bif import SamplerConfig, sample_sgld
from interp_toolkit.analyses.bif.dln_fast import batched_dln_sgld, dln_losses_and_gradients
from interp_toolkit.errors import UserError
from interp_toolkit.tasks.dln import (
    DeepLinearNetwork,
    DLNConfig,
    dln_per_example_loss,
    gradient_descent,
)
from interp_toolkit.tasks.hierarchical import animals_and_plants


def _networks(steps=(0, 150, 300)):
    data = animals_and_plants()
    X, Y = data.inputs.float(), data.targets.float()
    models = []
    for step in steps:
        model = DeepLinearNetwork(DLNConfig(data.n_items, 16, data.n_properties, init_scale=1e-3, seed=1))
        gradient_descent(model, data.inputs, data.targets, 0.05, step)
        models.append(model)
    W1 = torch.stack([m.W1.weight.detach().clone() for m in models])
    W2 = torch.stack([m.W2.weight.detach().clone() for m in models])
    return models, W1, W2, X, Y


def test_closed_form_losses_and_gradients_equal_autograd():
    models, W1, W2, X, Y = _networks()
    losses, g1, g2 = dln_losses_and_gradients(W1, W2, X, Y)
    for r, model in enumerate(models):
        model.zero_grad()
        per_example = dln_per_example_loss(model, (X, Y))
        per_example.mean().backward()
        torch.testing.assert_close(losses[r], per_example.detach())
        torch.testing.assert_close(g1[r], model.W1.weight.grad)
        torch.testing.assert_close(g2[r], model.W2.weight.grad)


def test_every_network_gets_the_library_samplers_chains():
    models, W1, W2, X, Y = _networks()
    config = SamplerConfig(eps=4e-4, gamma=100.0, n_beta=400.0, chains=3, draws=40, burn_in=30,
                           steps_between_draws=3, seed=7, progress=False)
    fast = batched_dln_sgld(W1, W2, X, Y, config)
    assert fast["losses"].shape == (3, 40, 3, X.shape[0]) and fast["distance"].shape == (3, 40, 3)
    for r, model in enumerate(models):
        drawn = torch.empty(3, 40, X.shape[0])

        def keep(chain, draw, values, drawn=drawn):
            drawn[chain, draw] = values["losses"]

        diagnostics = sample_sgld(model, (X, Y), dln_per_example_loss, config,
                                  recorders={"losses": lambda m: dln_per_example_loss(m, (X, Y))}, on_draw=keep)
        # the same noise, the same update: equal up to the float rounding of the gradient
        torch.testing.assert_close(fast["losses"][:, :, r], drawn, rtol=2e-4, atol=1e-6)
        torch.testing.assert_close(fast["loss_trace"][:, :, r], diagnostics.loss_trace[:, ::10].float(),
                                   rtol=2e-4, atol=1e-6)
    # chains differ from each other, and the draws move off w*
    assert not torch.equal(fast["losses"][0], fast["losses"][1]) and float(fast["distance"].min()) > 0
    assert torch.equal(batched_dln_sgld(W1, W2, X, Y, config)["losses"], fast["losses"])  # seeded


def test_a_seed_per_network_gives_each_the_library_chains_of_its_seed():
    models, W1, W2, X, Y = _networks((150, 300))
    config = SamplerConfig(eps=4e-4, gamma=100.0, n_beta=400.0, chains=2, draws=20, burn_in=10, seed=0,
                           progress=False)
    fast = batched_dln_sgld(W1, W2, X, Y, config, seeds=[11, 12])
    shared = batched_dln_sgld(W1, W2, X, Y, config)
    for r, seed in enumerate((11, 12)):
        drawn = torch.empty(2, 20, X.shape[0])

        def keep(chain, draw, values, drawn=drawn):
            drawn[chain, draw] = values["losses"]

        sample_sgld(models[r], (X, Y), dln_per_example_loss, SamplerConfig(**{**config.to_dict(), "seed": seed}),
                    recorders={"losses": lambda m: dln_per_example_loss(m, (X, Y))}, on_draw=keep)
        torch.testing.assert_close(fast["losses"][:, :, r], drawn, rtol=2e-4, atol=1e-6)
    # the default drives every network with one seed's noise; own seeds do not
    assert not torch.allclose(fast["losses"], shared["losses"])
    with pytest.raises(UserError, match="one sampler seed per network"):
        batched_dln_sgld(W1, W2, X, Y, config, seeds=[1])


def test_an_observable_is_recorded_at_every_draw():
    _, W1, W2, X, Y = _networks((0, 300))
    config = SamplerConfig(eps=4e-4, gamma=100.0, n_beta=400.0, chains=2, draws=6, burn_in=3, progress=False)
    out = batched_dln_sgld(W1, W2, X, Y, config, observable=lambda a, b: (b @ a).flatten(-2))
    n_out, n_in = W2.shape[1], W1.shape[2]
    assert out["observables"].shape == (2, 6, 2, n_out * n_in)
    # the map recorded at a draw gives the losses recorded at it: the same draw
    maps = out["observables"].reshape(2, 6, 2, n_out, n_in)
    losses = 0.5 * (X @ maps.transpose(-1, -2) - Y).pow(2).sum(-1)
    torch.testing.assert_close(losses, out["losses"])
    with pytest.raises(UserError, match="observable must return"):
        batched_dln_sgld(W1, W2, X, Y, config, observable=lambda a, b: a.sum())


def test_another_seed_gives_other_chains():
    _, W1, W2, X, Y = _networks((300,))
    base = dict(eps=4e-4, gamma=100.0, n_beta=400.0, chains=2, draws=5, burn_in=5, progress=False)
    a = batched_dln_sgld(W1, W2, X, Y, SamplerConfig(seed=0, **base))["losses"]
    b = batched_dln_sgld(W1, W2, X, Y, SamplerConfig(seed=1, **base))["losses"]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("change, needle", [
    ({"batch_size": 4}, "full batch"),
    ({"W1": "flat"}, "stacks"),
    ({"X": "narrow"}, "do not fit"),
    ({"trace_every": 0}, "trace_every"),
])
def test_bad_input_is_named(change, needle):
    _, W1, W2, X, Y = _networks((0,))
    config = SamplerConfig(eps=4e-4, gamma=100.0, n_beta=400.0, chains=1, draws=2, burn_in=0, progress=False,
                           batch_size=change.get("batch_size"))
    if change.get("W1") == "flat":
        W1 = W1[0]
    if change.get("X") == "narrow":
        X = X[:, :-1]
    with pytest.raises(UserError, match=needle):
        batched_dln_sgld(W1, W2, X, Y, config, trace_every=change.get("trace_every", 10))
