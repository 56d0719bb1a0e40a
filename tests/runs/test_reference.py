"""interp_toolkit.runs.reference.BareModel, an independent plain-PyTorch forward, against the
bridge (logits) and the lean engine (logits, loss and every parameter's gradient)."""

import pytest
import torch
import torch.nn.functional as F

from interp_toolkit.errors import UserError
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.runs.forward import ReadoutForward
from interp_toolkit.runs.reference import BareModel
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

TASK = MPSPConfig.from_task("max_parity_sum_parity", r=0.9, seq_len=6, n_values=10, n_train=256, n_eval=128, seed=0)


@pytest.mark.parametrize("n_layers", [1, 2])
def test_the_bare_module_computes_the_bridge_logits(n_layers):
    cfg = ModelConfig(n_layers=n_layers, n_heads=2, seed=3, **TASK.model_dims())
    model = build_model(cfg).eval()
    tokens = make_splits(TASK)["adv"].tokens
    for manual in (False, True):
        bare = BareModel(cfg, manual_attention=manual).eval()
        bare.load_toolkit_weights({k: v.detach() for k, v in model.state_dict().items()})
        with torch.no_grad():
            torch.testing.assert_close(bare(tokens), model(tokens)[:, -1], atol=1e-5, rtol=1e-5)
    # the state round-trips under the toolkit's names
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in bare.toolkit_state().items())


@pytest.mark.parametrize("n_layers", [1, 2])
def test_the_engine_loss_and_gradients_equal_the_reference(n_layers):
    """The lean readout engine computes the last layer at the readout query only; the reference
    computes every position. Their loss and gradients must agree to float rounding."""
    cfg = ModelConfig(n_layers=n_layers, n_heads=2, seed=5, **TASK.model_dims())
    model = build_model(cfg).train()
    forward = ReadoutForward(model, -1, "fast")
    assert forward.fast
    train = make_splits(TASK)["train"]
    tokens, labels = train.tokens[:128], train.labels[:128]
    bare = BareModel(cfg)
    bare.load_toolkit_weights({k: v.detach() for k, v in model.state_dict().items()})

    model.zero_grad(set_to_none=True)
    loss = forward.backward(tokens, labels)
    reference = F.cross_entropy(bare(tokens), labels)
    reference.backward()
    torch.testing.assert_close(loss, reference.detach(), atol=1e-6, rtol=1e-5)
    # state_dict(keep_vars=True) gives the bridge's own parameter objects under the toolkit's keys
    params = model.state_dict(keep_vars=True)
    bare_params = dict(bare.named_parameters())
    names = bare._toolkit_names()
    for ours, theirs in names.items():
        assert params[theirs].grad is not None, theirs
        torch.testing.assert_close(params[theirs].grad, bare_params[ours].grad, atol=1e-6, rtol=1e-4)
    assert len(names) == len([p for p in model.parameters() if p.requires_grad]), sorted(names.values())


def test_the_reference_refuses_an_architecture_it_does_not_write():
    cfg = ModelConfig(n_layers=1, n_heads=2, act_fn="gelu", **TASK.model_dims())
    with pytest.raises(UserError, match="act_fn='gelu'"):
        BareModel(cfg)
