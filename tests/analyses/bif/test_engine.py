"""The one BIF engine (analyses/bif/engine.py): tables streamed from draws equal the estimator
on the same draws; both front ends' standard errors are the method they name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from interp_toolkit.analyses.bif import SamplerConfig, compute_bif
from interp_toolkit.analyses.bif.engine import StreamedTable, pick_stderr, stream_tables
from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif
from interp_toolkit.analyses.bif.lm_tokens import TokenSet
from interp_toolkit.errors import UserError

torch.set_num_threads(1)


class Line(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.3, -0.2], dtype=torch.float64))


def line_loss(model: Line, batch: torch.Tensor) -> torch.Tensor:
    return (batch[:, :2] @ model.w - batch[:, 2]) ** 2


DATA = torch.randn(24, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
SAMPLER = SamplerConfig(eps=1e-3, gamma=50.0, n_beta=10.0, chains=3, draws=30, burn_in=5, progress=False)


def _run(phase_fn=None, block=1):
    kept: dict[str, list] = {"a": [], "b": [], "labels": []}

    def on_draw(chain, draw, values, label):
        values["w_twice"] = torch.cat([values["w"], 2 * values["w"]])  # a derived entry a table reads
        kept["a"].append(values["losses"].clone())
        kept["b"].append(values["w_twice"].clone())
        kept["labels"].append(label)

    recorders = {"losses": lambda m: line_loss(m, DATA[:5]), "w": lambda m: m.w.detach().clone()}
    tables = {"t": StreamedTable("losses", "w_twice", (5, 4), block=block), "u": StreamedTable("w", "losses", (2, 5))}
    estimates, _ = stream_tables(Line(), DATA, line_loss, SAMPLER, recorders, tables, phase_fn=phase_fn,
                                 on_draw=on_draw)
    shape = (SAMPLER.chains, SAMPLER.draws)
    a = torch.stack(kept["a"]).reshape(*shape, 5)
    b = torch.stack(kept["b"]).reshape(*shape, 4)
    return estimates, a, b, torch.tensor(kept["labels"]).reshape(shape)


@pytest.mark.parametrize("block", [1, 7])
def test_streamed_tables_equal_the_estimator_on_the_same_draws(block):
    from interp_toolkit.analyses.bif import Draws

    estimates, a, b, _ = _run(block=block)
    stored = compute_bif(Draws(a, b, {"w_twice": (0, 4)}))
    for field in ("bif", "stderr", "per_chain", "per_chain_stderr"):
        torch.testing.assert_close(getattr(estimates["t"], field), getattr(stored, field), rtol=1e-9, atol=1e-14)
    assert estimates["t"].bif.abs().max() > 0
    # the second table is another pairing of the same draws: the transpose of its block
    w = b[..., :2]
    stored_u = compute_bif(Draws(w, a, {"losses": (0, 5)}))
    torch.testing.assert_close(estimates["u"].bif, stored_u.bif, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(estimates["u"].bif, estimates["t"].bif[:, :2].T, rtol=1e-9, atol=1e-14)


def test_phase_labels_split_every_table_and_add_up():
    centre = 0.3
    estimates, _, _, labels = _run(phase_fn=lambda m: int(float(m.w[0].detach()) > centre))
    assert set(labels.unique().tolist()) == {0, 1}  # both phases drawn, so the split is tested
    phases = estimates["t"].phases
    assert phases is not None and phases.labels == [0, 1]
    torch.testing.assert_close(phases.within + phases.between, phases.total, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(phases.total, estimates["t"].bif, rtol=1e-9, atol=1e-14)


def test_pick_stderr_names_its_method_and_refuses_others():
    estimates, *_ = _run()
    estimate = estimates["t"]
    assert torch.equal(pick_stderr(estimate, "jackknife"), estimate.stderr)
    per_chain = estimate.per_chain
    torch.testing.assert_close(pick_stderr(estimate, "per_chain"), per_chain.std(0) / per_chain.shape[0] ** 0.5)
    assert not torch.allclose(pick_stderr(estimate, "per_chain"), estimate.stderr)
    with pytest.raises(UserError, match="'bootstrap'"):
        pick_stderr(estimate, "bootstrap")


def test_bad_tables_and_changing_sizes_are_refused():
    with pytest.raises(UserError, match="StreamedTable.shape"):
        StreamedTable("a", "b", (0, 3))
    with pytest.raises(UserError, match="StreamedTable.block"):
        StreamedTable("a", "b", (2, 3), block=0)
    with pytest.raises(UserError, match="recorded sizes changed"):
        stream_tables(Line(), DATA, line_loss, SAMPLER, {"w": lambda m: m.w.detach().clone()},
                      {"t": StreamedTable("w", "w", (2, 3))})


@pytest.mark.parametrize("pearson", [False, True])
def test_per_chain_stderr_of_group_means_is_the_spread_of_the_chains(pearson):
    """The per_chain method is the chains' spread for every path (it had returned the jackknife
    for streamed reductions and for the group-means Pearson convention)."""
    gen = torch.Generator().manual_seed(1)
    train = TokenSet(torch.randint(0, 9, (3, 6), generator=gen), torch.randint(0, 3, (3, 5), generator=gen))
    a = torch.randn(4, 20, 15, dtype=torch.float64, generator=gen)
    b = a[..., :10] + 0.5 * torch.randn(4, 20, 10, dtype=torch.float64, generator=gen)
    query = TokenSet(train.tokens[:2], train.classes[:2])
    kwargs = dict(pearson=pearson, pearson_convention="group_means")
    for reduction in ("class:class", "sequence:all", "token:token"):
        per_chain = compute_lm_bif(a, b, train, query, (reduction,), stderr_method="per_chain", **kwargs)[reduction]
        jackknife = compute_lm_bif(a, b, train, query, (reduction,), **kwargs)[reduction]
        torch.testing.assert_close(per_chain.stderr, per_chain.per_chain.std(0) / 2)
        torch.testing.assert_close(per_chain.bif, jackknife.bif)
        assert not torch.allclose(per_chain.stderr, jackknife.stderr)
