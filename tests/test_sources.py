import pytest
import torch

from interp_toolkit.errors import UserError
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
    with pytest.raises(UserError, match="kind"):
        CheckpointRef("s3", "x")


def test_checkpoint_range_expands_to_expected_revisions():
    from interp_toolkit.sources import expand_revisions, pythia_revisions

    refs = resolve_checkpoints(["hub:EleutherAI/pythia-14m@step{1000..143000:10000}"])
    assert [r.revision for r in refs] == [f"step{s}" for s in range(1000, 143001, 10000)]
    assert refs[0].revision == "step1000" and refs[-1].revision == "step141000" and len(refs) == 15
    assert [r.step for r in refs] == list(range(1000, 143001, 10000))
    assert all(r.kind == "hub" and r.location == "EleutherAI/pythia-14m" for r in refs)
    assert expand_revisions("step0,step{512..2048:512},step1024") == [
        "step0", "step512", "step1024", "step1536", "step2048",
    ]
    assert expand_revisions("ckpt{1..3}-final") == ["ckpt1-final", "ckpt2-final", "ckpt3-final"]
    pythia = pythia_revisions()
    assert len(pythia) == 154 and pythia[:4] == ["step0", "step1", "step2", "step4"]
    assert "step512" in pythia and pythia[11] == "step1000" and pythia[-1] == "step143000"
    assert [r.revision for r in resolve_checkpoints(["hub:x/y@pythia"])] == pythia
    for bad, message in (("step{5..1:1}", "empty"), ("step{1..5:0}", "empty"), ("step{1-5}", "malformed"),
                         ("step{0..143000}", "expands to 143001")):
        with pytest.raises(CheckpointLoadError, match=message):
            expand_revisions(bad)
    # every revision of a range fails offline with the same clear error
    for ref in resolve_checkpoints(["hub:EleutherAI/no-such-model-xyz@step{1000..3000:1000}"]):
        with pytest.raises(CheckpointLoadError, match="not in the local HF cache"):
            ref.load(offline=True)


@pytest.mark.parametrize("fault", ["truncated_shard", "pickle_only"])
def test_bad_local_weight_files_are_named_before_loading(tmp_path, fault):
    """A truncated safetensors shard, or a pickle pytorch_model.bin and no safetensors: a
    CheckpointLoadError (exit 2 in the CLI) naming the file, and nothing is unpickled."""
    directory = tmp_path / "step0"
    _save_tiny_neox(directory)
    shard = directory / "model.safetensors"
    if fault == "truncated_shard":
        shard.write_bytes(shard.read_bytes()[:-100])
        named = "model.safetensors is truncated"
    else:
        # A pickle that would run code if it were ever unpickled.
        import pickle

        class Boom:
            def __reduce__(self):
                return (exec, ("raise SystemExit('unpickled')",))

        (directory / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
        shard.unlink()
        named = "pytorch_model.bin is a pickle weight file"
    with pytest.raises(CheckpointLoadError, match=named):
        CheckpointRef("hf_local", str(directory), step=0).load()
