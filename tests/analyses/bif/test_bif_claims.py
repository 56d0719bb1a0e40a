"""Class-to-class influences (the claim quantities): against brute force on stored draws, and
on a planted model whose posterior is Gaussian with a known covariance."""

import math

import pytest
import torch
from torch import nn

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.claims import claim_influences, class_influence, parse_claim
from interp_toolkit.analyses.bif.diagnostics import ess_bulk, ess_tail, split_rhat
from interp_toolkit.analyses.bif.lm import LMBIFConfig, lm_bif
from interp_toolkit.analyses.bif.lm_estimate import naive_token_bif
from interp_toolkit.analyses.bif.lm_tokens import TokenSet, group_ids, reduce_matrix
from interp_toolkit.errors import UserError

torch.set_num_threads(1)
NAMES = ["random", "induction", "open", "close"]
# token id = class id; the loss of predicting a token of class k is 0.5 (w[PARAM[k]] - TARGET[k])^2,
# so induction losses depend on w[1] alone and both delimiters on w[2] (with opposite optima)
PARAM = torch.tensor([0, 1, 2, 2])
TARGET = torch.tensor([0.0, 1.0, -1.0, 1.0])


class Planted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))


def planted_losses(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    targets = tokens[:, 1:]
    return 0.5 * (model.w[PARAM[targets]] - TARGET[targets]) ** 2


def _sets(seq: int = 9):
    gen = torch.Generator().manual_seed(0)
    posterior = torch.randint(0, 4, (32, seq), generator=gen)
    query = torch.randint(0, 4, (12, seq), generator=gen)
    train = TokenSet(posterior[:12], posterior[:12, 1:], NAMES)
    return posterior, train, TokenSet(query, query[:, 1:], NAMES)


def _brute_force(train_draws, query_draws, train, query, source, target):
    """-Cov of the (source, target) class block from the per-token draws, by the full matrix."""
    ids_a, labels_a = group_ids(train, "class")
    ids_b, labels_b = group_ids(query, "class")
    matrix = reduce_matrix(naive_token_bif(train_draws, query_draws), ids_a, ids_b)
    return float(matrix[labels_a.index(source), labels_b.index(target)])


@pytest.mark.filterwarnings("ignore:LM BIF not converged")
def test_claims_match_brute_force_covariance_and_jackknife_on_stored_draws():
    posterior, train, query = _sets()
    config = LMBIFConfig(SamplerConfig(eps=0.05, gamma=2.0, n_beta=8.0, chains=4, draws=40, burn_in=10,
                                       batch_size=8, keep_draws=True, progress=False), reductions=("class:class",))
    result = lm_bif(Planted(), posterior, train, query, config, loss_fn=planted_losses)
    a, b = result.train_draws, result.query_draws
    chains = a.shape[0]
    claims = ["induction->induction", "open->close", "close:open", "random->induction",
              "open->close - random->random", "open->close - induction->induction"]
    got = claim_influences(result, claims)
    assert [g.name for g in got] == ["induction->induction", "open->close", "close->open", "random->induction",
                                     "open->close - random->random", "open->close - induction->induction"]
    for claim, influence in zip(claims, got):
        (s1, t1), second = parse_claim(claim)

        def value(a, b, second=second, s1=s1, t1=t1):
            v = _brute_force(a, b, train, query, s1, t1)
            return v - (_brute_force(a, b, train, query, *second) if second else 0.0)

        assert influence.bif == pytest.approx(value(a, b), rel=1e-9, abs=1e-12)
        loo = [value(a[[c for c in range(chains) if c != k]], b[[c for c in range(chains) if c != k]])
               for k in range(chains)]
        mean = sum(loo) / chains
        stderr = math.sqrt((chains - 1) / chains * sum((x - mean) ** 2 for x in loo))
        assert influence.stderr == pytest.approx(stderr, rel=1e-9, abs=1e-12) and influence.stderr > 0
        assert influence.leave_one_out.tolist() == pytest.approx(loo, rel=1e-9, abs=1e-12)
    # plain pairs equal the streamed class:class reduction and its (streamed) jackknife
    table = result["class:class"]
    for influence in got[:4]:
        i, j = table.row_labels.index(influence.source), table.col_labels.index(influence.target)
        assert influence.bif == pytest.approx(float(table.bif[i, j]), rel=1e-9, abs=1e-12)
        assert influence.stderr == pytest.approx(float(table.stderr[i, j]), rel=1e-6, abs=1e-12)
        assert influence.rhat == pytest.approx(float(result.convergence.rhat[i, j]), abs=1e-9)
    # R-hat / ESS of a difference: those of the difference of the product traces
    ids_a, _ = group_ids(train, "class")
    ids_b, _ = group_ids(query, "class")
    ga = torch.stack([a[..., ids_a == k].mean(-1) for k in range(4)], -1)
    gb = torch.stack([b[..., ids_b == k].mean(-1) for k in range(4)], -1)
    ga, gb = ga - ga.reshape(-1, 4).mean(0), gb - gb.reshape(-1, 4).mean(0)
    trace = (ga[..., 2] * gb[..., 3] - ga[..., 0] * gb[..., 0]).numpy()
    assert got[4].rhat == pytest.approx(split_rhat(trace), abs=1e-9)
    assert got[4].ess == pytest.approx(min(ess_bulk(trace), ess_tail(trace)), rel=1e-9)
    assert got[4].minus == "random->random" and got[0].minus is None


def _planted_truth(posterior, n_beta, gamma, eps):
    """Exact stationary covariances of SGLD on the planted (quadratic) posterior.

    Each w_k is Gaussian: precision lam = n_beta * (share of tokens whose loss uses w_k) + gamma,
    mean m = n_beta * sum(share * target) / lam (w* = 0); SGLD's discrete chain has variance
    1 / (lam (1 - eps lam / 4)) and the same mean. For z ~ N(m, s2) and losses 0.5 (z - a)^2,
    0.5 (z - b)^2: Cov = 0.5 s2^2 + (m - a)(m - b) s2.
    """
    targets = posterior[:, 1:].reshape(-1)
    share = torch.bincount(targets, minlength=4).double() / targets.numel()

    def moments(param):
        classes = [k for k in range(4) if PARAM[k] == param]
        lam = n_beta * float(share[classes].sum()) + gamma
        mean = n_beta * sum(float(share[k]) * float(TARGET[k]) for k in classes) / lam
        return mean, 1.0 / (lam * (1 - eps * lam / 4))

    def bif(source, target):
        ks, kt = NAMES.index(source), NAMES.index(target)
        if PARAM[ks] != PARAM[kt]:
            return 0.0
        m, s2 = moments(int(PARAM[ks]))
        return -(0.5 * s2**2 + (m - float(TARGET[ks])) * (m - float(TARGET[kt])) * s2)

    return bif


@pytest.mark.filterwarnings("ignore:LM BIF not converged")
def test_planted_model_gives_the_known_influences_with_their_signs():
    posterior, train, query = _sets()
    n_beta, gamma, eps = 8.0, 2.0, 0.05
    config = LMBIFConfig(SamplerConfig(eps=eps, gamma=gamma, n_beta=n_beta, chains=4, draws=1200, burn_in=150,
                                       batch_size=32, progress=False, seed=3), reductions=("class:class",))
    result = lm_bif(Planted(), posterior, train, query, config, loss_fn=planted_losses)
    truth = _planted_truth(posterior, n_beta, gamma, eps)
    ind = class_influence(result, "induction->induction")
    flip = class_influence(result, "open->close")
    null = class_influence(result, "random->induction")
    diff = class_influence(result, "open->close - induction->induction")
    # induction queries depend only on w[1], which induction training tokens pull towards
    # their optimum: helpful (negative); the delimiters pull w[2] in opposite directions:
    # harmful (positive); random tokens use another parameter: zero
    assert truth("induction", "induction") < -0.05 and truth("open", "close") > 0.1
    assert ind.bif < 0 < flip.bif
    for got, expected in ((ind, truth("induction", "induction")), (flip, truth("open", "close")),
                          (null, 0.0), (diff, truth("open", "close") - truth("induction", "induction"))):
        assert abs(got.bif - expected) < 4 * got.stderr + 0.02 * abs(expected), (
            got.name, got.bif, expected, got.stderr,
        )
        assert got.rhat < 1.05 and got.ess > 100
    assert ind.relative_error < 0.25 and flip.relative_error < 0.25


@pytest.mark.filterwarnings("ignore:LM BIF not converged")
def test_claim_errors_name_the_problem():
    with pytest.raises(UserError, match="not a class pair"):
        parse_claim("induction")
    with pytest.raises(UserError, match="not a class pair"):
        parse_claim("a->b - c")
    posterior, train, query = _sets()
    config = LMBIFConfig(SamplerConfig(eps=0.05, gamma=2.0, n_beta=8.0, chains=2, draws=4, burn_in=1,
                                       progress=False), reductions=("class:all",))
    result = lm_bif(Planted(), posterior, train, query, config, loss_fn=planted_losses)
    with pytest.raises(UserError, match=r"no query tokens of class 'bracket'.*\['random', 'induction', 'open', "
                                        r"'close'\]"):
        class_influence(result, "open->bracket")
    result.train_class_means = None
    with pytest.raises(UserError, match="recompute"):
        class_influence(result, "open->close")
