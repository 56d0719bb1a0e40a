import pytest
import torch

from interp_toolkit.sources import CheckpointLoadError, CheckpointRef, resolve_checkpoints

torch.set_num_threads(1)


def _save_tiny_neox(path, seed=0, vocab=23):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, rotary_pct=0.25)
    model = GPTNeoXForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def test_local_hf_directories_load_hook_and_match_hf(tmp_path):
    hf = {step: _save_tiny_neox(tmp_path / "ckpts" / f"step{step}", seed=step) for step in (0, 4, 16)}
    refs = resolve_checkpoints([tmp_path / "ckpts"])
    assert [r.step for r in refs] == [0, 4, 16] and {r.kind for r in refs} == {"hf_local"}
    x = torch.randint(0, 23, (2, 9))
    for ref in refs:
        bridge = ref.load()
        logits, cache = bridge.run_with_cache(x)
        assert torch.allclose(logits, hf[ref.step](x).logits, atol=1e-5)
        assert cache["blocks.1.attn.hook_pattern"].shape == (2, 2, 9, 9)
    # The Hub code path (name + revision through boot_transformers) on a local directory.
    hub_like = CheckpointRef("hub", str(tmp_path / "ckpts" / "step4"), revision="main")
    assert torch.allclose(hub_like.load()(x), hf[4](x).logits, atol=1e-5)


def test_hub_name_offline_gives_clear_error():
    ref = resolve_checkpoints(["hub:EleutherAI/no-such-model-xyz@step1000"])[0]
    assert ref.kind == "hub" and ref.revision == "step1000" and ref.step == 1000
    with pytest.raises(CheckpointLoadError, match="not in the local HF cache"):
        ref.load(offline=True)


def test_toolkit_run_dir_and_bad_specs(tmp_path):
    from interp_toolkit.checkpoint import save_checkpoint
    from interp_toolkit.model import ModelConfig, build_model

    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_vocab=11, n_ctx=8, d_model=16, d_mlp=32, seed=0))
    for epoch in (0, 10):
        save_checkpoint(model, tmp_path / "run" / "checkpoints" / f"epoch_{epoch:06d}.safetensors")
    refs = resolve_checkpoints([tmp_path / "run"])
    assert [(r.kind, r.step) for r in refs] == [("toolkit", 0), ("toolkit", 10)]
    x = torch.randint(0, 11, (1, 8))
    assert torch.allclose(refs[1].load()(x), model(x), atol=1e-6)
    with pytest.raises(CheckpointLoadError, match="neither"):
        resolve_checkpoints([tmp_path / "missing"])
    with pytest.raises(ValueError, match="kind"):
        CheckpointRef("s3", "x")
