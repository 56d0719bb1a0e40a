"""Adaptive chain length (``analyses/bif/adaptive.py``): rounds double draws and burn-in until
the chains converge or the budget runs out; a diverging step size is lowered; the commands
report which, and their figures mark unconverged estimates."""

from __future__ import annotations

import json
import warnings
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from interp_toolkit.analyses.bif import SamplerConfig, bif, plot_bif
from interp_toolkit.analyses.bif.adaptive import (
    BACKOFF,
    MAX_BACKOFFS,
    AdaptiveConfig,
    keep_final_round,
    until_converged,
)
from interp_toolkit.analyses.bif.config import SamplerDivergenceError
from interp_toolkit.errors import UserError

torch.set_num_threads(1)


def fake_run(converge_at_draws: int | None, diverge_above: float | None = None):
    """A BIF stand-in: converges once draws reach ``converge_at_draws``; warns otherwise."""
    calls: list[SamplerConfig] = []

    def run(config: SamplerConfig):
        calls.append(config)
        if diverge_above is not None and config.eps > diverge_above:
            raise SamplerDivergenceError(f"diverged at {config.eps}")
        ok = converge_at_draws is not None and config.draws >= converge_at_draws
        if not ok:
            warnings.warn(f"BIF not converged at {config.draws}", UserWarning, stacklevel=2)
        summary = {"converged": ok, "max_rhat": 1.0 if ok else 1.5, "min_ess_bulk": 400.0 if ok else 20.0,
                   "min_ess_tail": 300.0 if ok else 10.0}
        return SimpleNamespace(convergence=SimpleNamespace(summary=lambda: summary), config=config)

    return run, calls


BASE = SamplerConfig(eps=1e-3, chains=4, draws=10, burn_in=10, progress=False)


def test_rounds_double_until_converged_and_only_the_last_warns():
    run, calls = fake_run(converge_at_draws=40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, record = until_converged(run, BASE, AdaptiveConfig(max_steps=10_000))
    assert [(c.draws, c.burn_in) for c in calls] == [(10, 10), (20, 20), (40, 40)]
    assert {(c.eps, c.gamma, c.chains) for c in calls} == {(1e-3, BASE.gamma, 4)}  # the posterior never moves
    assert record.stopped == "converged" and record.converged and result.config.draws == 40
    assert [r["converged"] for r in record.rounds] == [False, False, True]
    assert not [w for w in caught if "not converged" in str(w.message)]  # earlier rounds' warnings dropped
    assert record.describe() == "converged at 40 draws after 40 burn-in steps per chain (3 rounds)"


def test_the_budget_stops_the_rounds_and_is_reported():
    run, calls = fake_run(converge_at_draws=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, record = until_converged(run, BASE, AdaptiveConfig(max_steps=100))
    # 20, 40, 80 steps per chain; the next (160) would exceed the budget of 100
    assert [c.total_steps for c in calls] == [20, 40, 80]
    assert record.stopped == "budget" and not record.converged
    text = record.describe()
    assert "budget of 100 SGLD steps per chain ran out" in text and "max R-hat 1.500" in text
    assert "min ESS bulk 20 / tail 10" in text
    assert [str(w.message) for w in caught] == ["BIF not converged at 40"]  # the last round's, once


def test_off_runs_once_and_one_chain_cannot_converge():
    run, calls = fake_run(converge_at_draws=None)
    _, record = until_converged(run, BASE, AdaptiveConfig(adaptive=False))
    assert len(calls) == 1 and record.stopped == "off" and "--no-adaptive" in record.describe()
    run, calls = fake_run(converge_at_draws=None)
    _, record = until_converged(run, SamplerConfig(chains=1, draws=10, burn_in=10), AdaptiveConfig())
    assert len(calls) == 1 and record.stopped == "one_chain" and ">= 2 chains" in record.describe()


def test_a_diverging_step_size_is_lowered_then_given_up():
    run, calls = fake_run(converge_at_draws=10, diverge_above=2e-4)
    result, record = until_converged(run, BASE, AdaptiveConfig())
    assert [c.eps for c in calls] == pytest.approx([1e-3, 1e-3 / BACKOFF, 1e-3 / BACKOFF**2])
    assert [r["diverged"] for r in record.rounds] == [True, True, False]
    assert record.converged and "SGLD diverged at eps 0.001, 0.000333" in record.describe()
    run, calls = fake_run(converge_at_draws=10, diverge_above=0.0)
    with pytest.raises(SamplerDivergenceError):
        until_converged(run, BASE, AdaptiveConfig())
    assert len(calls) == MAX_BACKOFFS + 1
    run, calls = fake_run(converge_at_draws=10, diverge_above=0.0)
    with pytest.raises(SamplerDivergenceError):  # off: the divergence is the user's to see
        until_converged(run, BASE, AdaptiveConfig(adaptive=False))
    assert len(calls) == 1


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "100"])
def test_bad_budgets_are_refused(bad):
    with pytest.raises(UserError, match="max_steps"):
        AdaptiveConfig(max_steps=bad)


def test_a_real_bif_converges_by_extension():
    """A linear model: the rounds reach R-hat <= 1.01 and ESS >= 100 on the true sampler."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(64, generator=gen)
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0, 0.5]]))
        model.bias.zero_()

    def loss_fn(m, batch):
        inputs, targets = batch
        return (m(inputs).squeeze(-1) - targets) ** 2

    config = SamplerConfig(eps=2e-3, gamma=10.0, n_beta=20.0, chains=4, draws=25, burn_in=25, seed=1,
                           progress=False)
    result, record = until_converged(partial(bif, model, (x, y), (x[:4], y[:4]), loss_fn), config,
                                     AdaptiveConfig(max_steps=20_000))
    assert record.stopped == "converged", record.rounds
    assert len(record.rounds) >= 2  # the first round did not converge: extension did it
    assert result.convergence.converged and result.convergence.max_rhat <= 1.01
    assert min(result.convergence.min_ess_bulk, result.convergence.min_ess_tail) >= 100
    assert result.config["draws"] == record.rounds[-1]["draws"]


def test_bif_figure_marks_unconverged_chains():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 2, generator=gen), torch.randn(16, generator=gen)
    model = torch.nn.Linear(2, 1)
    result = bif(model, (x, y), (x[:3], y[:3]), lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2,
                 SamplerConfig(eps=1e-4, chains=2, draws=4, burn_in=0, progress=False))
    assert not result.convergence.converged
    title = plot_bif(result)._suptitle.get_text()
    assert title.startswith("NOT converged (max R-hat") and "ESS >= 100" in title


def test_keep_final_round_copies_once(tmp_path):
    rounds = tmp_path / "out" / "rounds" / "bif_abc"
    rounds.mkdir(parents=True)
    (rounds / "bif.safetensors").write_bytes(b"x")
    target = keep_final_round(tmp_path / "out" / "rounds", tmp_path / "out", "bif_abc")
    assert (target / "bif.safetensors").read_bytes() == b"x"
    (target / "bif.safetensors").write_bytes(b"kept")  # a complete copy is not copied again
    keep_final_round(tmp_path / "out" / "rounds", tmp_path / "out", "bif_abc")
    assert (target / "bif.safetensors").read_bytes() == b"kept"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bif_abc", "rounds"]  # no staging left


def _tiny_checkpoint(tmp_path):
    from interp_toolkit.checkpoint import save_checkpoint
    from interp_toolkit.model import ModelConfig, build_model
    from interp_toolkit.tasks.mpsp import MPSPConfig

    task = MPSPConfig(seq_len=4, n_values=5, r=0.75, n_train=64, n_eval=16)
    model = build_model(ModelConfig(n_layers=1, n_heads=1, d_model=16, d_mlp=16, **task.model_dims()))
    checkpoint = save_checkpoint(model, tmp_path / "epoch_000010.safetensors", {"epoch": 10})
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    return checkpoint


def test_bif_command_reports_its_rounds(tmp_path, capsys):
    """`bif` at its default sampler, with a small budget: the rounds, which stopped them and
    the diagnostics are printed and in summary.json; the result sits at the top of --out."""
    from interp_toolkit.cli import main

    checkpoint = _tiny_checkpoint(tmp_path)
    args = ["bif", str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out", str(tmp_path / "out"),
            "--n-attribution", "8", "--n-query", "4", "--max-steps", "800", "--no-progress"]
    capsys.readouterr()
    assert main(args) == 0
    captured = capsys.readouterr()
    (folder,) = (tmp_path / "out").glob("bif_*")
    summary = json.loads((folder / "summary.json").read_text())
    rounds = summary["adaptive"]["rounds"]
    assert [r["steps_per_chain"] for r in rounds] == [200, 400, 800][: len(rounds)]
    assert summary["sampler_used"]["draws"] == rounds[-1]["draws"]
    if summary["adaptive"]["stopped"] == "converged":
        assert summary["convergence"]["max_rhat"] <= 1.01 and summary["convergence"]["min_ess_bulk"] >= 100
        assert "converged at" in captured.out
    else:
        assert summary["adaptive"]["stopped"] == "budget" and len(rounds) == 3
        assert "budget of 800 SGLD steps per chain ran out" in captured.out
        assert "max R-hat" in captured.out and captured.err.count("note: BIF at") == 3
    assert len(list((tmp_path / "out" / "rounds").glob("bif_*"))) == len(rounds)
    # a rerun recomputes nothing: every round is a cache hit
    assert main(args) == 0
    assert json.loads((folder / "summary.json").read_text())["adaptive"] == summary["adaptive"]


@pytest.mark.slow
def test_bif_at_every_default_converges_or_says_the_budget_ran_out(tmp_path, capsys):
    """`bif` with nothing but the checkpoint (up to 3,200 SGLD steps per chain: minutes)."""
    from interp_toolkit.cli import main

    checkpoint = _tiny_checkpoint(tmp_path)
    assert main(["bif", str(checkpoint), "--task-config", str(tmp_path / "task.json"), "--out",
                 str(tmp_path / "out"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(next((tmp_path / "out").glob("bif_*/summary.json")).read_text())
    if summary["adaptive"]["converged"]:
        assert summary["convergence"]["max_rhat"] <= 1.01
        assert min(summary["convergence"]["min_ess_bulk"], summary["convergence"]["min_ess_tail"]) >= 100
    else:
        assert "budget of 3200 SGLD steps per chain ran out" in out and "max R-hat" in out


def test_a_round_that_is_not_local_is_rerun_at_a_third_of_eps_with_local_backoff():
    from types import SimpleNamespace

    from interp_toolkit.analyses.bif.adaptive import AdaptiveConfig, until_converged
    from interp_toolkit.analyses.bif.config import SamplerConfig

    seen = []

    def run(config):  # local (and converged) only below eps 2e-5
        seen.append(config.eps)
        local = config.eps < 2e-5
        climb = 0.01 if local else 0.5
        return SimpleNamespace(convergence=SimpleNamespace(converged=True, summary=lambda: {"converged": True}),
                               locality=SimpleNamespace(local=local, worst_climb=climb))

    base = SamplerConfig(eps=9e-5, chains=4, draws=10, burn_in=10, progress=False)
    result, record = until_converged(run, base, AdaptiveConfig(max_steps=1000), local_backoff=True)
    assert seen == pytest.approx([9e-5, 3e-5, 1e-5]) and result.locality.local
    assert [r["local"] for r in record.rounds] == [False, False, True]
    assert "left the checkpoint's solution at eps 9e-05, 3e-05" in record.describe()
    seen.clear()  # without it (the default) a non-local round is final
    result, record = until_converged(run, base, AdaptiveConfig(max_steps=1000))
    assert seen == [9e-5] and not result.locality.local
