"""``sweep`` refuses a train run directory as its study (--out) or as a study to extend from."""

from __future__ import annotations

import pytest

from interp_toolkit.cli import main
from tests.studies.fakes import GEN, make_run


@pytest.mark.parametrize("dry_run", [True, False])
def test_out_that_is_a_run_directory_is_refused(tmp_path, capsys, dry_run):
    run_dir = make_run(tmp_path / "study", "c_r9_s0", 0.9, 0, GEN)
    before = sorted(p.name for p in run_dir.iterdir())
    argv = ["sweep", "--preset", "smoke", "--out", str(run_dir), "--quiet"] + (["--dry-run"] if dry_run else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} is a train run directory (it holds run.json); expected a study directory" in err
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written into it, no lock either


def test_extend_from_that_is_no_study_is_refused(tmp_path, capsys):
    study = tmp_path / "study"
    run_dir = make_run(study, "c_r9_s0", 0.9, 0, GEN)
    out = str(tmp_path / "long")
    assert main(["sweep", "--preset", "smoke", "--out", out, "--extend-from", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"--extend-from {run_dir} is a train run directory (it holds run.json); expected a study directory" in err
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    assert main(["sweep", "--preset", "smoke", "--out", out, "--extend-from", str(tmp_path / "plain"),
                 "--dry-run"]) == 2
    assert "holds neither runs/ nor any run directory" in capsys.readouterr().err
    # a study directory and its runs/ folder are both accepted
    for source in (study, study / "runs"):
        assert main(["sweep", "--preset", "smoke", "--out", out, "--extend-from", str(source), "--dry-run"]) == 0
        capsys.readouterr()
