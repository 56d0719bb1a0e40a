"""The claims CSV is the record: figures regenerate from it exactly."""

import math

import pytest
import torch

from interp_toolkit.analyses.bif.claims import influence_from_class_means
from interp_toolkit.errors import UserError
from interp_toolkit.studies.lm.claims import (
    CLAIM_CSV_FIELDS,
    CLAIM_LOCALITY_FIELDS,
    claim_figure_data,
    claim_peaks,
    claim_rows,
    plot_claim,
    read_claims_csv,
    rise_and_fall,
    sign_change,
    write_claim_figures,
    write_claims_csv,
)

LABELS = ["random", "induction", "open", "close"]
CLAIMS = ["induction->induction", "open->close", "open->close - close->open"]


def _rows():
    """Two seeds; seed 0's induction score rises (a measured transition), seed 1's does not."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for seed, scores in ((0, [0.03, 0.05, 0.4, 0.8, 0.82]), (1, [0.03, 0.04, 0.05, 0.06, 0.07])):
        for step, score in zip([0, 100, 200, 300, 400], scores):
            a = torch.randn(4, 30, 4, generator=gen, dtype=torch.float64)
            b = a + 0.5 * torch.randn(4, 30, 4, generator=gen, dtype=torch.float64)
            influences = [influence_from_class_means(a, b, LABELS, LABELS, c) for c in CLAIMS]
            rows += claim_rows(influences, step=step, seed=seed, induction_score=score)
    return rows


def _plotted(fig):
    ax, twin = fig.axes[0], fig.axes[1]
    lines = [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines + twin.lines]
    bands = [(c.get_label(), c.get_paths()[0].vertices.tolist()) for c in ax.collections]
    spans = [p.get_label() for p in ax.patches]
    return lines, bands, spans


def test_figures_regenerate_from_the_csv(tmp_path):
    rows = _rows()
    path = write_claims_csv(rows, tmp_path / "claims.csv")
    assert path.read_text().splitlines()[0] == ",".join(CLAIM_CSV_FIELDS + CLAIM_LOCALITY_FIELDS)
    back = read_claims_csv(path)
    assert len(back) == len(rows) == 2 * 5 * 3
    for series in CLAIMS:
        fresh, again = claim_figure_data(rows, series), claim_figure_data(back, series)
        assert fresh == again  # exact: floats are written as repr
        assert _plotted(plot_claim(fresh)) == _plotted(plot_claim(again))
    data = claim_figure_data(back, "open->close - close->open")
    assert data["seeds"][0]["transition"] == (200, 300) and data["seeds"][1]["transition"] is None
    lines, bands, spans = _plotted(plot_claim(data))
    assert spans == ["induction transition (10-90% of rise), seed 0"]  # only where one was measured
    # every estimate that fails R-hat <= 1.01 / ESS >= 100 is drawn again, hollow (30 draws: all of them)
    hollow = [f"not converged (R-hat > 1.01 or ESS < 100), seed {seed}" for seed in (0, 1)]
    assert [label for label, _, _ in lines if not label.startswith("_")] == [
        "BIF, training seed 0", hollow[0], "BIF, training seed 1", hollow[1], "induction score, seed 0",
        "induction score, seed 1"]
    for seed in (0, 1):
        mine = sorted((r for r in back if r["series"] == "open->close - close->open" and r["seed"] == seed),
                      key=lambda r: r["step"])
        unconverged = [(r["step"], r["bif"]) for r in mine if not (r["rhat"] <= 1.01 and r["ess"] >= 100)]
        assert unconverged
        marked = next((xs, ys) for label, xs, ys in lines if label == hollow[seed])
        assert list(zip(*marked)) == unconverged
    assert len(bands) == 2
    diff_rows = [r for r in back if r["series"] == "open->close - close->open"]
    assert all(r["minus"] == "close->open" and r["source_class"] == "open" for r in diff_rows)
    assert {r["minus"] for r in back if r["series"] == "open->close"} == {None}
    paths = write_claim_figures(back, tmp_path / "figs")
    assert sorted(p.name for p in paths) == ["claim_induction_to_induction.png", "claim_open_to_close.png",
                                             "claim_open_to_close_minus_close_to_open.png"]
    peaks = claim_peaks(back, "induction->induction")
    assert [p["seed"] for p in peaks] == [0, 1]
    best = max(
        (r for r in back if r["series"] == "induction->induction" and r["seed"] == 0), key=lambda r: abs(r["bif"])
    )
    assert peaks[0]["bif"] == best["bif"] and peaks[0]["relative_error"] == pytest.approx(
        best["stderr"] / abs(best["bif"])
    )
    assert math.isfinite(peaks[0]["rhat"])


def test_claims_csv_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_claims_csv(tmp_path / "nope.csv")
    (tmp_path / "bad.csv").write_text("step,seed,bif\n1,0,0.1\n")
    with pytest.raises(UserError, match="lacks columns"):
        read_claims_csv(tmp_path / "bad.csv")
    path = write_claims_csv(_rows()[:2], tmp_path / "ok.csv")
    path.write_text(path.read_text().replace("0.03", "zero", 1))
    with pytest.raises(UserError, match="line 2"):
        read_claims_csv(path)
    with pytest.raises(UserError, match="no rows of series 'x->y'"):
        claim_figure_data(_rows(), "x->y")


def _series(values, stderrs, series="induction->induction", seed=0):
    return [{"step": 100 * i, "seed": seed, "series": series, "bif": v, "stderr": e}
            for i, (v, e) in enumerate(zip(values, stderrs))]


def test_rise_and_fall_verdicts():
    # |bif| rises from 1 to 10 (z = 9 / sqrt(2)) and falls back to 2 (z = 8 / sqrt(2)): both measured
    rows = _series([-1.0, -4.0, -10.0, -2.0], [1.0, 1.0, 1.0, 1.0])
    rows += _series([-1.0, -4.0, -10.0, -9.0], [1.0, 1.0, 1.0, 1.0], seed=1)   # falls by 1: not measured
    rows += _series([-1.0, -1.5, -2.0, -1.0], [1.0, 1.0, 1.0, 1.0], seed=2)    # rises by 1: not measured
    found = {r["seed"]: r for r in rise_and_fall(rows, "induction->induction")}
    assert found[0]["verdict"] == "rise and fall" and found[0]["peak_step"] == 200
    assert found[0]["rise"] == 9.0 and found[0]["rise_stderr"] == pytest.approx(math.sqrt(2))
    assert found[0]["fall_z"] == pytest.approx(8 / math.sqrt(2))
    assert found[1]["verdict"] == "rise, no measured fall" and found[1]["fall"] == 1.0
    assert found[2]["verdict"] == "no measured rise"
    with pytest.raises(UserError, match="no rows of series 'open->close'"):
        rise_and_fall(rows, "open->close")
    exact = rise_and_fall(_series([-1.0, -3.0, -3.0], [0.0, 0.0, 0.0]), "induction->induction")[0]
    assert (exact["rise_z"], exact["fall_z"], exact["verdict"]) == (math.inf, 0.0, "rise, no measured fall")
    # the peak is the last checkpoint: no fall could have been seen, so none is tested
    last = rise_and_fall(_series([-1.0, -4.0, -10.0], [1.0, 1.0, 1.0]), "induction->induction")[0]
    assert (last["peak_step"], last["fall"]) == (200, 0.0)
    assert last["verdict"] == "rise, fall not tested (peak at the last checkpoint)"


def test_sign_change_verdicts():
    name = "open->close - close->open"
    rows = _series([0.03, 0.01, -0.02, -0.05], [0.01, 0.01, 0.01, 0.01], series=name)           # + then -
    rows += _series([-0.05, 0.01, 0.03], [0.01, 0.01, 0.02], series=name, seed=1)                # + is 1.5 se
    rows += _series([0.01, -0.01], [0.01, 0.01], series=name, seed=2)
    found = {r["seed"]: r for r in sign_change(rows, name)}
    assert found[0]["verdict"] == "sign change" and found[0]["order"] == "+ then -"
    assert (found[0]["max_step"], found[0]["min_step"]) == (0, 300) and found[0]["min_z"] == pytest.approx(-5.0)
    assert found[1]["verdict"] == "one sign" and found[1]["order"] == ""
    assert found[2]["verdict"] == "no measured sign"


def test_claim_rows_carry_the_locality_gate_and_the_figure_marks_non_local_points(tmp_path):
    rows = _rows()
    for row in rows:
        row["local"] = row["step"] != 200  # one checkpoint's draws left the solution
        row["climb"] = 0.05 if row["local"] else 0.4
    back = read_claims_csv(write_claims_csv(rows, tmp_path / "claims.csv"))
    assert {(r["step"], r["local"], r["climb"]) for r in back} == {(r["step"], r["local"], r["climb"]) for r in rows}
    data = claim_figure_data(back, CLAIMS[0])
    lines, _, _ = _plotted(plot_claim(data))
    far = [(label, xs) for label, xs, _ in lines if label.startswith("not local")]
    assert far and all(list(xs) == [200] for _, xs in far)
    # a CSV of an earlier version (no locality columns) still reads: unmeasured
    old = (tmp_path / "claims.csv").read_text().splitlines()
    header = old[0].split(",")
    keep = [header.index(c) for c in CLAIM_CSV_FIELDS]
    (tmp_path / "old.csv").write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in old) + "\n")
    assert all(r["local"] is None and math.isnan(r["climb"]) for r in read_claims_csv(tmp_path / "old.csv"))
