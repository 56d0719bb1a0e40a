import json
import os

import pytest
import torch

from interp_toolkit import CheckpointError, build_model, load_checkpoint, save_checkpoint
from interp_toolkit.checkpoint import read_checkpoint
from interp_toolkit.errors import UserError
from interp_toolkit.io import ARTIFACT_KEY, with_header_digest


@pytest.fixture
def saved(tmp_path, small_model_cfg):
    model = build_model(small_model_cfg)
    path = save_checkpoint(model, tmp_path / "ckpt.safetensors", metadata={"epoch": 7, "note": "x"})
    return model, path


def test_round_trip_is_exact(saved, small_model_cfg):
    model, path = saved
    loaded, metadata = load_checkpoint(path)
    assert metadata == {"epoch": 7, "note": "x"}
    tokens = torch.randint(0, small_model_cfg.d_vocab, (5, small_model_cfg.n_ctx))
    model.eval()
    assert torch.equal(loaded(tokens), model(tokens))
    assert loaded.interp_config == small_model_cfg
    # The reloaded model is a full TransformerLens model.
    _, cache = loaded.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pattern")
    assert "blocks.0.attn.hook_pattern" in cache


def test_reload_differs_from_fresh_init(saved, small_model_cfg):
    # Guards the TransformerLens 4 failure mode where a reload silently loads nothing: a
    # trained (perturbed) model must not come back as its initialization.
    model, path = saved
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    save_checkpoint(model, path)
    loaded, _ = load_checkpoint(path)
    fresh = build_model(small_model_cfg)
    trained, initial = model.state_dict(), fresh.state_dict()
    changed = [k for k in trained if not torch.equal(trained[k], initial[k])]
    assert len(changed) >= len(list(model.parameters()))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, trained[key])
    for key in changed:
        assert not torch.equal(loaded.state_dict()[key], initial[key])


def test_silent_noop_load_is_detected(saved, monkeypatch):
    model, path = saved
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    save_checkpoint(model, path)
    from torch.nn.modules.module import _IncompatibleKeys
    from transformer_lens.model_bridge import TransformerBridge

    # Simulate a bridge that reports success and loads nothing.
    monkeypatch.setattr(TransformerBridge, "load_state_dict",
                        lambda self, *a, **k: _IncompatibleKeys([], []))
    with pytest.raises(CheckpointError, match="was not loaded"):
        load_checkpoint(path)


def test_truncated_file_raises_naming_it(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(path)


def test_corrupted_header_raises(saved):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[10:30] = b"\xff" * 20
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="ckpt.safetensors"):
        load_checkpoint(path)


def test_missing_file_and_foreign_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.safetensors")
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="not an interp_toolkit checkpoint"):
        load_checkpoint(foreign)


def test_mismatched_config_raises(saved, tmp_path):
    from safetensors.torch import load, save

    _, path = saved
    raw = path.read_bytes()
    tensors = load(raw)
    header = json.loads(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"][ARTIFACT_KEY])
    cfg = header["metadata"]["model_config"]
    header["metadata"]["model_config"] = {**cfg, "d_model": 32, "d_head": 16}
    bad = tmp_path / "mismatch.safetensors"
    # Re-digested, as a writer of a wrong config would: the shape check must catch it.
    bad.write_bytes(save(tensors, metadata={ARTIFACT_KEY: json.dumps(with_header_digest(header))}))
    with pytest.raises(CheckpointError, match="mismatch.safetensors.*shape"):
        load_checkpoint(bad)
    del tensors["unembed.weight"]
    del header["digests"]["unembed.weight"]
    header["metadata"]["model_config"] = cfg
    bad.write_bytes(save(tensors, metadata={ARTIFACT_KEY: json.dumps(with_header_digest(header))}))
    with pytest.raises(CheckpointError, match="missing keys"):
        load_checkpoint(bad)


def test_corrupted_tensor_bytes_are_caught_naming_file_and_tensor(saved, tmp_path):
    from safetensors.torch import load, save

    _, path = saved
    raw = path.read_bytes()
    tensors = load(raw)
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
    tensors["embed.weight"] = tensors["embed.weight"].clone()
    tensors["embed.weight"][0, 0] += 1.0  # same shape, other bytes: only the digest can tell
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(save(tensors, metadata=header))
    with pytest.raises(CheckpointError, match="flipped.safetensors: tensor embed.weight does not match"):
        load_checkpoint(bad)


def test_format_1_checkpoints_are_still_read(saved, tmp_path):
    from safetensors.torch import load, save

    model, path = saved
    cfg, tensors, meta = read_checkpoint(path)
    legacy = tmp_path / "legacy.safetensors"
    legacy.write_bytes(save(load(path.read_bytes()), metadata={
        "interp_toolkit.format": "1", "interp_toolkit.model_config": cfg.to_json(),
        "interp_toolkit.metadata": json.dumps(meta)}))
    loaded, legacy_meta = load_checkpoint(legacy)
    assert legacy_meta == meta
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


def test_write_is_atomic(saved, monkeypatch):
    model, path = saved
    before = path.read_bytes()

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(model, path, metadata={"epoch": 8})
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_metadata_must_be_json(saved):
    model, path = saved
    with pytest.raises(UserError, match="JSON-serializable"):
        save_checkpoint(model, path, metadata={"bad": object()})


def test_a_flipped_bit_is_refused_by_the_cli(tiny_run, tmp_path, capsys):
    """One bit flipped inside a tensor of a run's checkpoint: `info` and `analyze` exit 2 naming it."""
    import shutil

    from interp_toolkit.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run[0], run_dir)
    path = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    raw = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    raw[header_end + 5] ^= 0x40  # inside the first tensor's bytes
    path.write_bytes(bytes(raw))
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and path.name in err and "does not match" in err and "Traceback" not in err
    assert main(["analyze", str(run_dir), "--analysis", "fingerprints", "--last", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and path.name in err
