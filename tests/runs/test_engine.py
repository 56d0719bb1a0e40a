"""The fast readout engine computes what the TransformerBridge computes, and trains the same."""

from __future__ import annotations

import copy
import itertools
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import interp_toolkit.runs.cost as cost
import interp_toolkit.runs.engine as engine
from interp_toolkit import ModelConfig, TrainConfig, build_model, load_checkpoint, train
from interp_toolkit.devices import resolve_device
from interp_toolkit.errors import UserError
from interp_toolkit.runs.batched import StackedModel, train_batched
from interp_toolkit.runs.engine import EngineFallbackWarning, readout_logits, stacked_grads
from interp_toolkit.runs.forward import ReadoutForward
from interp_toolkit.runs.optim import adamw_step
from interp_toolkit.runs.trainer import evaluate, list_checkpoints
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits
from interp_toolkit.threads import torch_threads

GRID = list(itertools.product((1, 2), (1, 2), ("LN", None), ("relu", "gelu")))
D_VOCAB, N_CTX, N_OUT = 12, 8, 3


def _model(n_layers, n_heads, norm, act, dtype=torch.float32, seed=0, **kw):
    cfg = ModelConfig(n_layers=n_layers, n_heads=n_heads, d_vocab=D_VOCAB, n_ctx=N_CTX, d_vocab_out=N_OUT,
                      d_model=16, d_mlp=32, normalization=norm, act_fn=act, seed=seed, **kw)
    model = build_model(cfg)
    with torch.no_grad():  # move LN weights / biases off their 1 / 0 init so they matter
        generator = torch.Generator().manual_seed(seed + 100)
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    if dtype != torch.float32:
        model.to(dtype)
    return model


def _inputs(n=48, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, D_VOCAB, (n, N_CTX), generator=generator),
            torch.randint(0, N_OUT, (n,), generator=generator))


@pytest.mark.parametrize("n_layers, n_heads, norm, act", GRID)
def test_readout_logits_equal_the_bridge(n_layers, n_heads, norm, act):
    model = _model(n_layers, n_heads, norm, act)
    tokens, _ = _inputs()
    forward = ReadoutForward(model, -1)
    assert forward.fast
    with torch.no_grad():
        full = model(tokens)
        for position in (-1, 3):
            reference = full[:, position]
            scale = reference.abs().max()
            for table in (True, False):  # layer 0 from the (token, position) table, or per row
                out = readout_logits(forward.spec, forward.params(), tokens, position, table=table)[0]
                assert (out - reference).abs().max() <= 1e-5 * scale, (position, table)
    # the random weights make the logits depend on the input (the check is not vacuous)
    assert full[:, -1].std(0).min() > 1e-3


@pytest.mark.parametrize("attention, key_pad", [("matmul", 16), ("sdpa", 16), ("padded", 3)])
def test_other_attention_paths_equal_the_bridge_too(monkeypatch, attention, key_pad):
    monkeypatch.setattr(engine, "ATTENTION", attention)
    monkeypatch.setattr(engine, "KEY_PAD", key_pad)  # 3: keys padded 8 -> 9 and 4 -> 6
    model = _model(2, 2, "LN", "gelu")
    tokens, _ = _inputs()
    forward = ReadoutForward(model, -1)
    with torch.no_grad():
        full = model(tokens)
        for position in (-1, 3):
            reference = full[:, position]
            out = readout_logits(forward.spec, forward.params(), tokens, position)[0]
            assert (out - reference).abs().max() <= 1e-5 * reference.abs().max(), position


def test_padded_keys_get_zero_probability():
    mask = engine._score_mask(3, 5, 16, causal=True, like=torch.zeros(()))
    assert mask.shape == (3, 16)
    visible = torch.isfinite(mask)
    # queries are positions 2, 3, 4 of 5: each sees keys 0..itself, never a padding key
    assert visible.sum(1).tolist() == [3, 4, 5]
    assert not visible[:, 5:].any()
    assert engine._score_mask(1, 5, 16, causal=False, like=torch.zeros(())).isfinite().sum() == 5


@pytest.mark.parametrize("n_layers, n_heads, norm, act", GRID)
def test_gradients_equal_the_bridge_for_every_parameter(n_layers, n_heads, norm, act):
    model = _model(n_layers, n_heads, norm, act)
    tokens, labels = _inputs()
    F.cross_entropy(model(tokens)[:, -1], labels).backward()
    bridge_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ReadoutForward(model, -1).loss(tokens, labels).backward()
    overall = max(g.abs().max() for g in bridge_grads.values())
    for name, param in model.named_parameters():
        reference = bridge_grads[name]
        assert param.grad is not None, name
        # relative to the parameter's own gradient; attn.k.bias has a true gradient of 0
        # (softmax is shift-invariant), so its rounding noise is judged on the overall scale
        scale = max(reference.abs().max(), 1e-2 * overall)
        assert (param.grad - reference).abs().max() <= 1e-5 * scale, name


@pytest.mark.parametrize("n_layers, n_heads, norm, act", [(1, 2, "LN", "relu"), (2, 2, "LN", "gelu"),
                                                          (2, 1, None, "relu")])
def test_float64_training_matches_the_bridge_for_50_steps(n_layers, n_heads, norm, act):
    tokens, labels = _inputs(64)
    fast = _model(n_layers, n_heads, norm, act, dtype=torch.float64)
    bridge = copy.deepcopy(fast)
    runs = []
    for model, engine_name in ((fast, "fast"), (bridge, "bridge")):
        forward = ReadoutForward(model, -1, engine_name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98), weight_decay=0.1)
        for _ in range(50):
            optimizer.zero_grad(set_to_none=True)
            forward.loss(tokens, labels).backward()
            optimizer.step()
        runs.append(model.state_dict())
    start = _model(n_layers, n_heads, norm, act, dtype=torch.float64).state_dict()
    moved = max(float((runs[0][k] - start[k]).abs().max()) for k in start)
    assert moved > 0.1  # 50 steps of lr 1e-2 really moved the weights
    for key, value in runs[1].items():
        assert float((runs[0][key] - value).abs().max()) <= 1e-9, key


def test_float32_training_matches_the_bridge_for_a_few_steps():
    tokens, labels = _inputs(64)
    fast = _model(2, 2, "LN", "relu")
    bridge = copy.deepcopy(fast)
    for model, engine_name in ((fast, "fast"), (bridge, "bridge")):
        forward = ReadoutForward(model, -1, engine_name)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            forward.loss(tokens, labels).backward()
            optimizer.step()
    # AdamW turns rounding-level gradient differences into up to lr-sized steps
    # (and the k bias has only rounding noise as gradient): compare at lr scale.
    for (key, a), b in zip(fast.state_dict().items(), bridge.state_dict().values(), strict=True):
        assert float((a - b).abs().max()) <= 3e-3, key


def test_functional_adamw_equals_torch_adamw():
    generator = torch.Generator().manual_seed(0)
    shapes = [(3, 5), (7,), (2, 4, 4)]
    params = [torch.randn(s, generator=generator) for s in shapes]
    mine = [p.clone() for p in params]
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    for weight_decay in (0.1, 0.0):
        optimizer = torch.optim.AdamW(torch_params, lr=3e-3, betas=(0.9, 0.98), weight_decay=weight_decay)
        exp_avgs = [torch.zeros_like(p) for p in params]
        exp_avg_sqs = [torch.zeros_like(p) for p in params]
        for step in range(1, 8):
            grads = [torch.randn(s, generator=generator) for s in shapes]
            for p, g in zip(torch_params, grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
            adamw_step(mine, grads, exp_avgs, exp_avg_sqs, step, 3e-3, (0.9, 0.98), weight_decay)
            for a, b in zip(mine, torch_params, strict=True):
                assert torch.equal(a, b.detach()), (weight_decay, step)
        state = optimizer.state_dict()["state"]
        for i in range(len(shapes)):
            assert torch.equal(state[i]["exp_avg"], exp_avgs[i])
            assert torch.equal(state[i]["exp_avg_sq"], exp_avg_sqs[i])
    assert not torch.equal(mine[0], params[0])


def test_stacked_members_compute_what_single_members_compute():
    cfgs = [ModelConfig(n_layers=2, n_heads=2, d_vocab=D_VOCAB, n_ctx=N_CTX, d_vocab_out=N_OUT, d_model=16,
                        d_mlp=32, seed=s) for s in (0, 1, 2)]
    stacked = StackedModel(cfgs)
    assert stacked.spec is not None
    tokens, labels = _inputs(40)
    params, constants = stacked.engine_tensors()
    for chunk in (None, 16):  # one pass, or the gradient accumulated over passes of 16 examples
        grads, losses = stacked_grads(stacked.spec, params, constants, tokens, labels, -1, chunk)
        for i, cfg in enumerate(cfgs):
            model = build_model(cfg)
            loss = ReadoutForward(model, -1).backward(tokens, labels, chunk)
            assert torch.equal(losses[i], loss)
            for key, tensor in model.state_dict(keep_vars=True).items():
                if isinstance(tensor, torch.nn.Parameter):
                    assert torch.equal(grads[key][i], tensor.grad), (chunk, i, key)
        if chunk is None:
            one_pass = grads
        else:  # passes change only the rounding
            for key, grad in grads.items():
                torch.testing.assert_close(grad, one_pass[key], rtol=1e-5, atol=1e-7)
    assert not torch.equal(losses[0], losses[1])


def test_stacked_members_make_the_passes_of_single_runs(monkeypatch):
    # a budget so small that a single run takes 2 passes (32 + 8 examples): each member is computed alone,
    # by its single run's own passes (bit for bit), never in more passes than K runs
    monkeypatch.setattr(cost, "CPU_MEMBER_POSITIONS_PER_PASS", 16 * N_CTX)
    cfgs = [ModelConfig(n_layers=2, n_heads=2, d_vocab=D_VOCAB, n_ctx=N_CTX, d_vocab_out=N_OUT, d_model=16,
                        d_mlp=32, seed=s) for s in (0, 1, 2)]
    stacked = StackedModel(cfgs)
    tokens, labels = _inputs(40)
    with torch_threads(1):
        assert cost.default_engine_chunk(1, 40, "cpu", stacked.spec, N_CTX) == 32  # the floor
        assert cost.members_per_pass(3, 32, N_CTX) == 1
        assert cost.members_per_pass(3, 5, N_CTX) == 3  # small batches: members share a pass
        assert cost.members_per_pass(3, 8, N_CTX) == 2
        params, constants = stacked.engine_tensors()
        grads, losses = stacked_grads(stacked.spec, params, constants, tokens, labels, -1)
        for i, cfg in enumerate(cfgs):
            model = build_model(cfg)
            loss = ReadoutForward(model, -1).backward(tokens, labels)
            assert torch.equal(losses[i], loss)
            for key, tensor in model.state_dict(keep_vars=True).items():
                if isinstance(tensor, torch.nn.Parameter):
                    assert torch.equal(grads[key][i], tensor.grad), (i, key)
        # members grouped two per pass (passes of 8 examples) still compute their own runs
        grads, losses = stacked_grads(stacked.spec, params, constants, tokens, labels, -1, chunk_size=8)
        model = build_model(cfgs[2])
        assert torch.equal(losses[2], ReadoutForward(model, -1).backward(tokens, labels, 8))
        assert torch.equal(grads["blocks.0.attn.q.weight"][2], model.state_dict(keep_vars=True)[
            "blocks.0.attn.q.weight"].grad)


@pytest.fixture
def task_splits():
    task = MPSPConfig(seq_len=5, n_train=192, n_eval=64, r=0.9)
    return task, make_splits(task)


def test_k_seed_engine_equals_k_single_runs(tmp_path, task_splits):
    task, splits = task_splits
    cfgs = [ModelConfig(n_layers=2, n_heads=2, d_model=16, d_mlp=32, seed=s, **task.model_dims()) for s in (0, 1)]
    train_cfg = TrainConfig(epochs=8, lr=3e-3, eval_every=4, checkpoint_every=4, progress=False)
    train_batched(cfgs, splits, train_cfg, [tmp_path / f"b{i}" for i in range(2)])
    for i, cfg in enumerate(cfgs):
        single = train(build_model(cfg), splits, train_cfg, tmp_path / f"s{i}")
        batched_model, _ = load_checkpoint(list_checkpoints(tmp_path / f"b{i}")[-1][1])
        # the same ops per member for any K: the weights agree bit for bit
        for key, value in single.model.state_dict().items():
            assert torch.equal(batched_model.state_dict()[key], value), (i, key)
        logged = [json.loads(x) for x in (tmp_path / f"b{i}" / "metrics.jsonl").read_text().splitlines()]
        assert len(logged) == len(single.metrics)
        for batched_row, single_row in zip(logged, single.metrics, strict=True):
            for key, value in single_row.items():  # losses are summed in another order there
                assert batched_row[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


def test_engine_checkpoint_loads_and_every_analysis_runs(tmp_path, task_splits):
    from interp_toolkit.analyses.ablation import ablation
    from interp_toolkit.analyses.fingerprints import fingerprints
    from interp_toolkit.analyses.gradients import gradient_conflict
    from interp_toolkit.analyses.patching import minimal_pair_patching

    task, splits = task_splits
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **task.model_dims())
    result = train(build_model(cfg), splits, TrainConfig(epochs=30, lr=3e-3, eval_every=10, progress=False),
                   tmp_path)
    assert result.metrics[-1]["train_loss"] < result.metrics[0]["train_loss"]
    model, meta = load_checkpoint(list_checkpoints(tmp_path)[-1][1])
    assert meta["epoch"] == 30
    for key, value in result.model.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    # the logged metrics are the bridge's metrics of that checkpoint (to rounding)
    bridge_metrics = evaluate(model, splits, engine="bridge")
    for key, value in bridge_metrics.items():
        assert meta["metrics"][key] == pytest.approx(value, abs=1e-5), key
    ablated = ablation(model, splits, method="mean", split_names=["val"], n=32)
    clean_acc = ablated.table.where(metric="accuracy", split="val").rows[0]["clean"]
    assert 0.0 <= clean_acc <= 1.0 and len(ablated.rows) > 0
    fp = fingerprints(model, splits, split="train", n=64)
    assert len(fp.rows) > 0
    patched = minimal_pair_patching(model, splits, source="val", target="adv", n=16)
    assert len(patched.rows) > 0
    conflict = gradient_conflict(model, splits, split="train", n=64)
    assert len(conflict.rows) > 0


def test_inexpressible_config_falls_back_to_the_bridge_and_says_so_once(tmp_path, task_splits, monkeypatch):
    monkeypatch.setattr(engine, "_warned", set())
    task, splits = task_splits
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, positional_embedding="rotary",
                      **task.model_dims())
    model = build_model(cfg)
    with pytest.warns(EngineFallbackWarning, match="positional_embedding='rotary'"):
        forward = ReadoutForward(model, -1)
    assert not forward.fast
    tokens = splits["val"].tokens
    with torch.no_grad():
        assert torch.equal(forward(tokens), model(tokens)[:, -1])
    calls = {"n": 0}
    real_forward = type(model).forward

    def counting_forward(self, *args, **kwargs):
        calls["n"] += 1
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting_forward)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)  # said once already: silent now
        result = train(model, splits, TrainConfig(epochs=3, eval_every=3, progress=False), tmp_path)
    assert calls["n"] >= 3  # the bridge's forward trained it
    assert result.metrics[-1]["epoch"] == 3


def test_bridge_options_the_engine_cannot_express_fall_back(monkeypatch):
    monkeypatch.setattr(engine, "_warned", set())
    model = _model(1, 2, "LN", "relu")
    model.cfg.attn_scores_soft_cap = 30.0
    with pytest.warns(EngineFallbackWarning, match="soft cap"):
        assert not ReadoutForward(model, -1).fast
    assert ReadoutForward(model, -1, "bridge").fast is False


def test_bad_engine_device_and_position_are_refused(tmp_path, task_splits):
    task, splits = task_splits
    with pytest.raises(UserError, match="engine must be one of"):
        TrainConfig(engine="turbo")
    with pytest.raises(UserError, match="device must be"):
        TrainConfig(device="tpu")
    if not torch.cuda.is_available():
        cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **task.model_dims())
        with pytest.raises(UserError, match="CUDA is not available"):
            train(build_model(cfg), splits, TrainConfig(device="cuda", progress=False), tmp_path / "r")
        assert not (tmp_path / "r").exists()
        assert resolve_device("auto") == torch.device("cpu")
    forward = ReadoutForward(_model(1, 1, "LN", "relu"), 20)
    with pytest.raises(UserError, match="readout position 20"):
        forward(_inputs()[0])


def test_train_restores_the_callers_thread_count(tmp_path, task_splits, monkeypatch):
    task, splits = task_splits
    cfg = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=32, **task.model_dims())
    seen = []
    real_backward = ReadoutForward.backward

    def spying_backward(self, *args):
        seen.append(torch.get_num_threads())
        return real_backward(self, *args)

    monkeypatch.setattr(ReadoutForward, "backward", spying_backward)
    with torch_threads(2):
        train(build_model(cfg), splits, TrainConfig(epochs=2, progress=False), tmp_path)
        assert torch.get_num_threads() == 2  # restored
    assert seen and set(seen) == {1}  # a tiny workload trains on one thread
    with torch_threads(3):
        assert torch.get_num_threads() == 3
        with torch_threads(None):
            assert torch.get_num_threads() == 3
    with pytest.raises(UserError, match="positive integer"):
        with torch_threads(0):
            pass
