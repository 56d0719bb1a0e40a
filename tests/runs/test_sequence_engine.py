"""The lean language-model forward (every position) computes what the TransformerBridge
computes, sees in-place and SGLD parameter updates, and is what the BIF's next-token
losses run on toolkit models."""

from __future__ import annotations

import gc
import itertools
import math
import weakref

import pytest
import torch
import torch.nn.functional as F

import interp_toolkit.runs.engine as engine
from interp_toolkit import ModelConfig, build_model
from interp_toolkit.analyses.bif import SamplerConfig, bif
from interp_toolkit.analyses.bif.lm_tokens import next_token_losses
from interp_toolkit.errors import UserError
from interp_toolkit.runs.forward import SequenceForward, sequence_forward

GRID = list(itertools.product((1, 2), (1, 2), ("LN", None), ("relu", "gelu"), (False, True)))
VOCAB, N_CTX = 11, 9


def _model(n_layers=2, n_heads=2, norm="LN", act="relu", attn_only=False, seed=0):
    model = build_model(ModelConfig(n_layers=n_layers, n_heads=n_heads, d_vocab=VOCAB, n_ctx=N_CTX, d_model=16,
                                    d_mlp=32, normalization=norm, act_fn=act, attn_only=attn_only, seed=seed))
    with torch.no_grad():  # move LN weights / biases off their 1 / 0 init so they matter
        generator = torch.Generator().manual_seed(seed + 100)
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    return model


def _tokens(n=24, length=N_CTX, seed=1):
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def _lm_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("n_layers, n_heads, norm, act, attn_only", GRID)
def test_sequence_logits_and_gradients_equal_the_bridge(n_layers, n_heads, norm, act, attn_only):
    model = _model(n_layers, n_heads, norm, act, attn_only)
    forward = SequenceForward(model)
    assert forward.fast
    for length in (N_CTX, 5):  # the full context and a shorter input
        tokens = _tokens(length=length)
        reference = model(tokens)
        out = forward(tokens)
        assert out.shape == reference.shape
        assert (out - reference).abs().max() <= 1e-5 * reference.abs().max(), length
    assert reference.std(0).min() > 1e-3  # the logits depend on the input: not vacuous

    tokens = _tokens()
    _lm_loss(model(tokens), tokens).backward()
    bridge_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _lm_loss(forward(tokens), tokens).backward()
    overall = max(g.abs().max() for g in bridge_grads.values())
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        # attn.k.bias has a true gradient of 0 (softmax is shift-invariant): judged on the overall scale
        scale = max(bridge_grads[name].abs().max(), 1e-2 * overall)
        assert (param.grad - bridge_grads[name]).abs().max() <= 1e-5 * scale, name


def test_longer_input_than_the_context_is_refused():
    with pytest.raises(UserError, match="exceeds the model's n_ctx=9"):
        SequenceForward(_model())(_tokens(length=N_CTX + 1))


def test_it_reads_the_live_parameters_and_the_cache_follows_the_model():
    model = _model()
    tokens = _tokens()
    forward = sequence_forward(model)
    assert sequence_forward(model) is forward
    before = forward(tokens).detach().clone()
    with torch.no_grad():
        model.state_dict()["blocks.0.attn.q.weight"].mul_(3.0)  # in place, as an optimizer does
    after = forward(tokens)
    assert not torch.allclose(before, after)
    assert (after - model(tokens)).abs().max() <= 1e-5 * after.abs().max()

    other = _model(seed=7)
    model.load_state_dict(other.state_dict(), assign=True)  # new parameter objects
    assert not forward.current()
    rebuilt = sequence_forward(model)
    assert rebuilt is not forward
    assert (rebuilt(tokens) - other(tokens)).abs().max() <= 1e-5 * other(tokens).abs().max()

    alive = weakref.ref(model)
    del model, forward, rebuilt
    gc.collect()
    assert alive() is None  # the cache keeps no model alive


def test_bridge_engine_and_other_models_use_the_modules_own_forward():
    model = _model()
    assert not SequenceForward(model, engine="bridge").fast
    with pytest.warns(engine.EngineFallbackWarning, match="no interp_toolkit ModelConfig"):
        engine._warned.discard("the model has no interp_toolkit ModelConfig")
        assert not SequenceForward(torch.nn.Linear(2, 2)).fast

    class Bigram(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(VOCAB, VOCAB)

        def forward(self, tokens):
            return self.table(tokens)

    bigram = Bigram()
    tokens = _tokens()
    expected = F.cross_entropy(bigram(tokens)[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    assert torch.allclose(next_token_losses(bigram, tokens), expected, rtol=1e-6, atol=1e-6)
    bigram.table.weight.data.mul_(0)  # the module's own forward really is what ran
    assert torch.allclose(next_token_losses(bigram, tokens), torch.full_like(expected, math.log(VOCAB)))


def test_bif_with_the_lean_next_token_losses_equals_the_bridge_forward():
    """SGLD swaps each parameter's ``.data`` for a view of one flat buffer: the lean forward
    must see every step, so the BIF equals the one computed through ``model(tokens)``."""
    model = _model()
    pool, recorded = _tokens(64, seed=2), _tokens(12, seed=3)

    def bridge_losses(m, tokens):
        logits = m(tokens)
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none").mean(-1)

    def lean_losses(m, tokens):
        return next_token_losses(m, tokens).mean(-1)

    config = SamplerConfig(eps=1e-3, gamma=100.0, n_beta=20.0, chains=2, draws=15, burn_in=5, batch_size=16,
                           seed=0, progress=False)
    reference = bif(model, pool, recorded, bridge_losses, config).bif
    lean = bif(model, pool, recorded, lean_losses, config).bif
    assert reference.abs().max() > 0
    assert torch.allclose(lean, reference, rtol=1e-3, atol=1e-4 * reference.abs().max())
    # restored afterwards: the model's weights are the checkpoint's again
    assert (sequence_forward(model)(recorded) - model(recorded)).abs().max() < 1e-5 * model(recorded).abs().max()


@pytest.mark.parametrize("length", [2, 5, N_CTX])
def test_next_token_losses_of_a_toolkit_model_equal_the_bridges(length):
    """The lean path skips the last token (no loss reads its logits) and pads the keys."""
    model = _model()
    tokens = _tokens(length=length)
    logits = model(tokens)
    expected = F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")
    out = next_token_losses(model, tokens)
    assert out.shape == (tokens.shape[0], length - 1)
    assert (out - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("norm, act", [("LN", "relu"), (None, "gelu")])
def test_layer0_table_and_in_place_paths_equal_the_bridge(norm, act):
    model = _model(norm=norm, act=act)
    forward = SequenceForward(model)
    tokens = _tokens(n=64)
    reference = model(tokens)
    for table in (True, False):
        out = engine.sequence_logits(forward.spec, forward.params, tokens, table=table)
        assert (out - reference).abs().max() <= 1e-5 * reference.abs().max(), table
        with torch.inference_mode():  # the in-place (no autograd) path
            out = engine.sequence_logits(forward.spec, forward.params, tokens, table=table)
        assert (out - reference).abs().max() <= 1e-5 * reference.abs().max(), table
