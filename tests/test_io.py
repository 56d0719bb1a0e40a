"""Atomic writes: whole files or nothing, with the permissions a plain write gives."""

import os
import stat

import pytest

from interp_toolkit.io import atomic_write_bytes, atomic_write_json, file_digest


def _plain_write_mode(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    return stat.S_IMODE(plain.stat().st_mode)


def test_atomic_write_gives_plain_write_permissions_not_owner_only(tmp_path):
    path = atomic_write_json(tmp_path / "results" / "table.json", {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == _plain_write_mode(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) & stat.S_IRGRP  # readable by the group under umask 022


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "f.bin"
    atomic_write_bytes(path, b"old")
    atomic_write_bytes(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_failed_write_keeps_old_file_and_removes_temp(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_json(path, {"ok": True})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"bad": object()})
    assert path.read_text().strip().startswith("{") and "ok" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]
    assert os.path.exists(path)


def test_file_digest_keys_a_file_by_its_bytes(tmp_path):
    import hashlib

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"weights")
    b.write_bytes(b"weights")
    assert file_digest(a) == file_digest(str(b)) == hashlib.sha256(b"weights").hexdigest()[:16]
    assert len(file_digest(a, length=64)) == 64 and file_digest(a, length=64).startswith(file_digest(a))
    b.write_bytes(b"weights!")  # rewritten: another key
    assert file_digest(b) != file_digest(a)


def test_read_jsonl_names_a_file_that_is_not_utf8(tmp_path):
    from interp_toolkit.errors import UserError
    from interp_toolkit.io import read_jsonl

    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n')
    with pytest.raises(UserError, match="rows.jsonl is not UTF-8"):
        read_jsonl(path)


def test_checkpoint_cache_serves_verified_entries_and_recomputes_the_rest_with_one_note(tmp_path, capsys):
    from interp_toolkit.io import CheckpointCache, config_hash, file_digest

    checkpoint = tmp_path / "epoch_000010.safetensors"
    checkpoint.write_bytes(b"weights")
    cache = CheckpointCache(tmp_path / "cache", "demo")
    path = cache.path(10, checkpoint, {"config": {"n": 4}, "version": 1})
    # the key hashes the checkpoint's digest with the settings (the scheme of every cache)
    assert (
        path.name
        == f"epoch_000010_{config_hash({'checkpoint': file_digest(checkpoint), 'config': {'n': 4}, 'version': 1})}.json"
    )
    assert cache.read(path, 10) is None and cache.rejected == []  # a miss is no problem
    cache.write(path, {"rows": [{"value": 1.407}]})
    assert cache.read(path, 10) == {"rows": [{"value": 1.407}]}  # served without its digest field
    assert cache.path(10, checkpoint, {"config": {"n": 5}, "version": 1}) != path  # other settings: other entry
    path.write_text(path.read_text().replace("1.407", "9.407"))  # a flipped digit
    assert cache.read(path, 10) is None
    cache.report()
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "demo: recomputed 1 cache entry" in err and "epoch 10" in err
    assert "content does not match its digest" in err
