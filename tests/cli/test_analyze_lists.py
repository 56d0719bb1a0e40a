"""``analyze`` refuses a value listed twice and a --reference it would ignore."""

from __future__ import annotations

import pytest

from interp_toolkit.cli import main


@pytest.mark.parametrize("flag, values", [("--split-names", ["adv", "adv"]), ("--components", ["L0H0", "L0H1", "L0H0"]),
                                          ("--epochs", ["3", "6", "3"])])
def test_a_value_listed_twice_is_refused(tmp_path, capsys, flag, values):
    assert main(["analyze", str(tmp_path), "--analysis", "ablation", flag, *values]) == 2
    err = capsys.readouterr().err
    assert f"{flag} lists {values[0]} more than once" in err and len(err.strip().splitlines()) == 1


def test_reference_is_refused_where_it_would_be_ignored_or_unknown(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    assert main(["analyze", str(run_dir), "--analysis", "ablation", "--method", "zero", "--reference", "nope"]) == 2
    assert "--reference nope applies to --method mean or resample" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["analyze", str(run_dir), "--analysis", "ablation", "--reference", "nope", "--last",
                 "--out-dir", str(out), "--no-progress", "--no-plot"]) == 2
    assert "split 'nope' not found; available splits" in capsys.readouterr().err
    assert not list(out.glob("*.csv"))
