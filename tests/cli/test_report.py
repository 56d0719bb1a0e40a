"""``interp-toolkit report`` with several sources, --out, --compare on regime keys, --rate-axis."""

from __future__ import annotations

from interp_toolkit.cli import main
from interp_toolkit.studies.report.write import write_report
from tests.studies.fakes import GEN, STUCK, make_study


def test_cli_several_sources_compare_with_regime_keys(tmp_path, capsys):
    a = make_study(tmp_path / "calibration", [("c_r9", 0.9, [GEN, GEN], {"seq_len": 8}),
                                          ("c_r5", 0.5, [STUCK, STUCK], {"seq_len": 8})])
    b = make_study(tmp_path / "final", [("f_r9", 0.9, [GEN, STUCK], {"n_layers": 2}),
                                    ("f_r5", 0.5, [STUCK, STUCK], {"n_layers": 2})])
    write_report(b, print_table=False)
    capsys.readouterr()
    assert main(["report", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and str(a) in err
    out = tmp_path / "merged"
    assert main(["report", str(a), str(b / "outcomes.csv"), "--out", str(out), "--compare",
                 "r=0.9,seq_len=8", "r=0.5,seq_len=8", "L=2,r=0.9", "L=2,r=0.5"]) == 0
    printed = capsys.readouterr().out
    assert "2/2" in printed and "1/2" in printed and "seq_len" in printed
    assert (out / "table.csv").is_file() and (out / "generalization_rate.png").is_file()
    assert "runs from outcomes CSVs have no learning curves" in printed
    # the seq_len column tells the regimes apart: r=0.9 alone matches two cells
    assert main(["report", str(a), str(b / "outcomes.csv"), "--out", str(out), "--compare", "r=0.9", "r=0.5"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and "seq_len (5, 8)" in err
    assert main(["report", str(tmp_path / "nothing_here.csv")]) == 2
    assert "nothing_here.csv" in capsys.readouterr().err
    # categorical axis and a CSV alone, written beside it by default
    assert main(["report", str(b / "outcomes.csv"), "--rate-axis", "categorical"]) == 0
    assert "curves: skipped" in capsys.readouterr().out
