"""Analysis cache entries carry a digest of their content: an edited number, a torn file or
non-UTF-8 bytes are recomputed with a one-line notice, and the results do not change."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from interp_toolkit.cli import main

from ..runs.test_integrity import train_args

ANALYZE = ["--analysis", "weight_norms", "--no-progress", "--no-plot"]


@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cache") / "run"
    assert main(train_args(run_dir)) == 0
    assert main(["analyze", str(run_dir), *ANALYZE]) == 0
    return run_dir


def _edit_number(path):
    """``"norm": 15.56`` -> ``"norm": 95.56``: the first digit of the first norm changed."""
    text = path.read_text()
    match = re.search(r'"norm": (\d)', text)
    digit = str((int(match.group(1)) + 8) % 10)
    path.write_text(text[: match.start(1)] + digit + text[match.end(1):])


FAULTS = {
    "edited_number": _edit_number,
    "torn": lambda path: path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2]),
    "not_utf8": lambda path: path.write_bytes(b"\xff\xfe" + path.read_bytes()),
    "digest_removed": lambda path: path.write_text(json.dumps(
        {k: v for k, v in json.loads(path.read_text()).items() if k != "header_digest"})),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_bad_cache_entry_is_recomputed_with_a_notice(analysed_run, tmp_path, fault, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(analysed_run, run_dir)
    out = run_dir / "analyses" / "weight_norms"
    expected_csv = (out / "weight_norms.csv").read_bytes()
    entry = sorted((out / "cache").glob("epoch_000003_*.json"))[0]
    FAULTS[fault](entry)
    capsys.readouterr()
    assert main(["analyze", str(run_dir), *ANALYZE]) == 0
    captured = capsys.readouterr()
    assert "1 checkpoint(s) computed, 5 from cache" in captured.out
    assert "note: weight_norms: recomputed 1 cache entry" in captured.err and "epoch 3" in captured.err
    assert (out / "weight_norms.csv").read_bytes() == expected_csv
    assert main(["analyze", str(run_dir), *ANALYZE]) == 0  # the rewritten entry is served again
    assert "0 checkpoint(s) computed, 6 from cache" in capsys.readouterr().out
