"""The reusable SGLD step (analyses/bif/sgld.py): the update by hand, stacked chains, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from interp_toolkit.analyses.bif import SGLD
from interp_toolkit.errors import UserError


def test_one_step_is_the_update_written_by_hand():
    w = [torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64), torch.tensor([3.0], dtype=torch.float64)]
    centre = [torch.zeros(2, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)]
    grads = [torch.tensor([[1.0, 2.0], [-1.0, 0.0]], dtype=torch.float64), torch.tensor([-4.0], dtype=torch.float64)]
    before = [t.clone() for t in w]
    eps, gamma, n_beta = 0.01, 3.0, 50.0
    sgld = SGLD(w, centre, eps=eps, gamma=gamma, n_beta=n_beta, grads=grads,
                generator=torch.Generator().manual_seed(7))
    distance = sgld.step()
    xi = torch.randn(5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    expected = [b - eps / 2 * (n_beta * g + gamma * (b - c)) + math.sqrt(eps) * x
                for b, g, c, x in zip(before, grads, centre, (xi[:4].view(2, 2), xi[4:]), strict=True)]
    for got, want in zip(w, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    assert distance.item() == pytest.approx(math.sqrt(0.25 + 1 + 4 + 0.0625 + 4))


def test_a_missing_gradient_counts_as_zero_and_dot_grad_is_read():
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (w * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    plain = torch.ones(3, dtype=torch.float64)  # no .grad at all
    SGLD([w, plain], [torch.zeros(3, dtype=torch.float64)] * 2, eps=1e-2, gamma=0.0, n_beta=1.0,
         generator=torch.Generator().manual_seed(0)).step()
    xi = torch.randn(6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(
        w.detach(), 1 - 0.005 * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) + 0.1 * xi[:3]
    )
    torch.testing.assert_close(plain, 1 + 0.1 * xi[3:])


def test_stacked_chains_equal_separate_chains_bit_for_bit():
    chains = 3
    torch.manual_seed(0)
    start = [torch.randn(chains, 4, 5), torch.randn(chains, 7)]
    centre = [torch.randn(4, 5).expand(chains, 4, 5).clone(), torch.randn(7).expand(chains, 7).clone()]
    stacked = [t.clone() for t in start]
    gens = [torch.Generator().manual_seed(100 + c) for c in range(chains)]
    grads = [torch.empty_like(t) for t in stacked]
    sgld = SGLD(stacked, centre, eps=1e-3, gamma=10.0, n_beta=30.0, grads=grads, generator=gens)
    alone = [[t[c].clone() for t in start] for c in range(chains)]
    alone_grads = [[torch.empty_like(t) for t in a] for a in alone]
    singles = [SGLD(alone[c], [t[c] for t in centre], eps=1e-3, gamma=10.0, n_beta=30.0, grads=alone_grads[c],
                    generator=torch.Generator().manual_seed(100 + c)) for c in range(chains)]
    for _ in range(5):
        for g, t in zip(grads, stacked, strict=True):
            g.copy_(t.sin())  # a gradient that depends on the weights
        distances = sgld.step()
        for c in range(chains):
            for g, t in zip(alone_grads[c], alone[c], strict=True):
                g.copy_(t.sin())
            assert torch.allclose(singles[c].step(), distances[c], rtol=1e-6, atol=0)
    for c in range(chains):
        for t, a in zip(stacked, alone[c], strict=True):
            assert torch.equal(t[c], a)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"eps": 0.0}, "eps must be a positive finite number, got 0.0"),
    ({"eps": float("nan")}, "eps must be a positive finite number, got nan"),
    ({"gamma": -1.0}, "gamma must be a finite number >= 0, got -1.0"),
    ({"n_beta": 0}, "n_beta must be a positive finite number, got 0"),
])
def test_bad_settings_are_refused_naming_the_value(kwargs, named):
    settings = {"eps": 1e-3, "gamma": 1.0, "n_beta": 1.0, **kwargs}
    with pytest.raises(UserError, match=named.replace("(", r"\(")):
        SGLD([torch.zeros(2)], [torch.zeros(2)], **settings)


def test_mismatched_shapes_and_chain_counts_are_refused_before_any_step():
    with pytest.raises(UserError, match=r"centre must match params.*\[\(3,\)\] for \[\(2,\)\]"):
        SGLD([torch.zeros(2)], [torch.zeros(3)], eps=1e-3, gamma=1.0, n_beta=1.0)
    with pytest.raises(UserError, match=r"one generator per chain \(2\).*\[\(3, 4\)\]"):
        SGLD([torch.zeros(3, 4)], [torch.zeros(3, 4)], eps=1e-3, gamma=1.0, n_beta=1.0,
             generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(UserError, match=r"grads must give one tensor per entry of params \(1\), got 2"):
        SGLD([torch.zeros(2)], [torch.zeros(2)], eps=1e-3, gamma=1.0, n_beta=1.0,
             grads=[torch.zeros(2), torch.zeros(2)])
