"""Report settings per run, regime-keyed cells, several sources, the rate figure, a known 2x2."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from scipy.stats import fisher_exact

from interp_toolkit.errors import UserError
from interp_toolkit.io import atomic_write_json
from interp_toolkit.studies.grid.cells import CELL_FIELDS, REGIME_FIELDS, find_cell
from interp_toolkit.studies.grid.outcome_table import RUN_FIELDS, merge_runs, read_outcomes_csv
from interp_toolkit.studies.report.format import format_table
from interp_toolkit.studies.report.plots import plot_rate_vs_r
from interp_toolkit.studies.report.tables import rate_table
from interp_toolkit.studies.report.write import write_report, write_report_sources
from tests.studies.fakes import GEN, STUCK, make_run, make_study


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_rows_and_outcomes_csv_carry_every_run_setting(tmp_path):
    make_run(tmp_path, "a", 0.9, 3, GEN, early_stop=True, seq_len=8, n_values=12, n_train=16_384, n_eval=2_048,
              data_seed=7, n_layers=2, n_heads=1, d_model=32, d_mlp=96, weight_decay=0.4, lr=3e-3, epochs=15_000,
              batch_size=512, eval_every=50)
    make_run(tmp_path, "b", 0.5, 0, STUCK)
    atomic_write_json(tmp_path / "study.json", {"outcome_thresholds": {"threshold": 0.99}})
    result = write_report(tmp_path, print_table=False)
    row = next(r for r in result["rows"] if r["r"] == 0.9)
    expected = {"task": "max_parity_sum_parity", "seq_len": 8, "n_values": 12, "n_train": 16_384, "n_eval": 2_048,
                "data_seed": 7, "n_layers": 2, "n_heads": 1, "d_model": 32, "d_mlp": 96, "weight_decay": 0.4,
                "lr": 3e-3, "epochs": 15_000, "batch_size": 512, "eval_every": 50, "early_stop": True,
                "threshold": 0.99, "r": 0.9, "seed": 3}
    assert {k: row[k] for k in expected} == expected
    other = next(r for r in result["rows"] if r["r"] == 0.5)
    assert other["early_stop"] is False and other["batch_size"] is None and other["seq_len"] == 5
    written = _read_csv(result["paths"]["outcomes_csv"])
    at_r = RUN_FIELDS.index("r")  # the settings every table names sit among the cell settings, before r
    named = ["train.betas", "train.grad_clip", "train.lr_schedule", "train.min_lr_ratio", "train.warmup_steps"]
    assert list(written[0]) == [*RUN_FIELDS[:at_r], *named, *RUN_FIELDS[at_r:]]
    assert [written[0][k] for k in named[1:]] == ["", "constant", "0.0", "0"]  # the defaults
    assert list(written[0]).index("steps") == list(written[0]).index("epochs") + 1
    # 16,384 examples in batches of 512: 32 steps per epoch; the run stopped at epoch 20 of 15,000
    assert (row["steps"], row["lr_x_wd"], row["decay_clocks"]) == (640, 0.0012, 0.768)
    assert (other["steps"], other["lr_x_wd"], other["decay_clocks"]) == (20, 0.0001, 0.002)  # full batch: 1 a step
    by_r = {float(r["r"]): r for r in written}
    assert by_r[0.9]["seq_len"] == "8" and by_r[0.9]["early_stop"] == "True" and by_r[0.9]["lr"] == "0.003"
    assert by_r[0.9]["epochs"] == "15000" and by_r[0.9]["data_seed"] == "7" and by_r[0.5]["batch_size"] == ""
    assert by_r[0.9]["train.betas"] == "[0.9, 0.98]" and by_r[0.9]["decay_clocks"] == "0.768"
    # read back typed as written
    back = {r["r"]: r for r in read_outcomes_csv(result["paths"]["outcomes_csv"])}
    assert {k: back[0.9][k] for k in expected} == expected
    assert back[0.5]["early_stop"] is False and back[0.5]["batch_size"] is None


def test_cells_are_keyed_by_regime_settings(tmp_path):
    # the same architecture and r in two regimes (length 5 and 8) and two budgets: never pooled
    make_study(tmp_path, [
        ("len5_r9", 0.9, [GEN, GEN, STUCK], {}),
        ("len5_r5", 0.5, [STUCK, STUCK], {}),
        ("len8_r9", 0.9, [STUCK, STUCK], {"seq_len": 8}),
        ("len8_r5", 0.5, [STUCK, GEN], {"seq_len": 8}),
        ("long_r9", 0.9, [GEN], {"epochs": 1000, "lr": 3e-4, "n_train": 16_384, "d_model": 32, "d_mlp": 64}),
    ])
    result = write_report(tmp_path, print_table=False)
    table = result["table"]
    assert len(table) == 5
    counts = {(row["seq_len"], row["epochs"], row["r"]): (row["n_generalized"], row["n_seeds"]) for row in table}
    assert counts == {(5, 300, 0.9): (2, 3), (5, 300, 0.5): (0, 2), (8, 300, 0.9): (0, 2), (8, 300, 0.5): (1, 2),
                      (5, 1000, 0.9): (1, 1)}
    # contrasts pair r values within one regime only: length 5 and length 8, not across
    pairs = {(c["seq_len"], c["k_a"], c["n_a"], c["k_b"], c["n_b"]) for c in result["contrasts"]}
    assert pairs == {(5, 2, 3, 0, 2), (8, 0, 2, 1, 2)}
    assert all("seq_len=" in c["cell_a"] and "seq_len=" in c["cell_b"] for c in result["contrasts"])
    # table.csv has every cell field; the printed table only the regime columns that vary
    columns = list(_read_csv(result["paths"]["table_csv"])[0])
    assert [k for k in columns if k in CELL_FIELDS] == list(CELL_FIELDS)
    at = columns.index("epochs") + 1  # each cell's clock at its budget, next to epochs
    assert columns[at: at + 3] == ["steps", "lr_x_wd", "decay_clocks"]
    steps = {(row["seq_len"], row["epochs"]): row["steps"] for row in table}
    assert all(steps[key] == key[1] for key in steps)  # full batch: one step per epoch
    header = format_table(table).splitlines()[0].split()
    for varying in ("seq_len", "n_train", "d_model", "d_mlp", "lr", "epochs"):
        assert varying in header
    for constant in ("n_values", "n_eval", "data_seed", "batch_size", "eval_every", "early_stop", "threshold"):
        assert constant not in header
    one_regime = [row for row in table if row["epochs"] == 300 and row["seq_len"] == 5]
    assert format_table(one_regime).splitlines()[0].split()[:8] == ["task", "L", "H", "wd", "r", "steps", "clocks",
                                                                     "seeds"]


def test_find_cell_regime_keys_and_ambiguity(tmp_path):
    make_study(tmp_path, [
        ("a", 0.9, [GEN], {}), ("b", 0.9, [STUCK], {"seq_len": 8}), ("c", 0.5, [GEN], {"seq_len": 8}),
        ("d", 0.9, [GEN], {"seq_len": 8, "batch_size": 256}),
    ])
    for run in (tmp_path / "runs").iterdir():
        if run.name.startswith("d"):
            record = json.loads((run / "run.json").read_text())
            record["run_info"]["early_stop"] = {"rule": "generalized_paper_criterion", "threshold": 1.0}
            atomic_write_json(run / "run.json", record)
    table = rate_table(write_report(tmp_path, print_table=False)["rows"])
    assert find_cell(table, "L=1,r=0.9,seq_len=5")["seq_len"] == 5
    assert find_cell(table, "r=0.9, seq_len=8, batch_size=full")["n_generalized"] == 0
    assert find_cell(table, "r=0.9,early_stop=true")["batch_size"] == 256
    assert find_cell(table, "L=1,r=0.5")["seq_len"] == 8
    with pytest.raises(UserError, match="ambiguous") as err:
        find_cell(table, "L=1,r=0.9")
    message = str(err.value)
    assert "'L=1,r=0.9'" in message and "matches 3 cells" in message
    assert "seq_len (5, 8)" in message and "batch_size (256, full)" in message
    assert "seq_len=5" in message and "seq_len=8" in message  # the matching cells are named
    with pytest.raises(UserError, match="matches no cell"):
        find_cell(table, "L=1,r=0.9,seq_len=10")
    with pytest.raises(UserError, match="not an integer"):
        find_cell(table, "seq_len=eight")
    with pytest.raises(UserError, match="not a boolean"):
        find_cell(table, "early_stop=maybe")
    with pytest.raises(UserError, match="KEY=VALUE"):
        find_cell(table, "length=8")


def test_report_from_outcomes_csv_alone_equals_report_frommake_study(tmp_path, capsys):
    study = make_study(tmp_path / "study", [
        ("one_r9", 0.9, [GEN, STUCK, STUCK, STUCK], {}),
        ("one_r5", 0.5, [STUCK, STUCK], {}),
        ("two_r9", 0.9, [GEN, GEN, GEN], {"n_layers": 2}),
        ("two_r5", 0.5, [STUCK, STUCK, STUCK], {"n_layers": 2}),
        ("two_r1", 0.1, [STUCK, STUCK], {"n_layers": 2}),
    ])
    compare = [("L=2,r=0.9", "L=2,r=0.5")]
    first = write_report(study, out_dir=tmp_path / "from_study", compare=compare, print_table=False)
    saved = tmp_path / "kept" / "outcomes.csv"
    saved.parent.mkdir()
    shutil.copy(first["paths"]["outcomes_csv"], saved)
    shutil.rmtree(study)  # no run directories left: only the CSV
    second = write_report_sources([saved], tmp_path / "from_csv", compare=compare)
    assert second["table"] == first["table"]
    assert second["contrasts"] == first["contrasts"]
    assert second["comparisons"] == first["comparisons"]
    for name in ("outcomes_csv", "table_csv", "contrasts_csv", "table_md"):
        assert second["paths"][name].read_text() == first["paths"][name].read_text(), name
    assert second["paths"]["rate_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert second["paths"]["curves_png"] is None and not (tmp_path / "from_csv" / "curves_by_cell.png").exists()
    assert first["paths"]["curves_png"].is_file()
    printed = capsys.readouterr().out
    assert "curves: skipped" in printed and "outcomes CSV" in printed


def test_several_sources_merge_and_count_a_run_once(tmp_path, capsys):
    a = make_study(tmp_path / "a", [("x_r9", 0.9, [GEN, STUCK], {}), ("x_r5", 0.5, [STUCK], {})])
    b = make_study(tmp_path / "b", [("y_r9", 0.9, [GEN], {"seq_len": 8}), ("y_r5", 0.5, [GEN, GEN], {"seq_len": 8})])
    write_report(a, print_table=False)
    copy_of_a = tmp_path / "a_copy"
    shutil.copytree(a, copy_of_a)  # the same runs, found twice
    result = write_report_sources([a, b, a / "outcomes.csv", copy_of_a], tmp_path / "merged")
    assert result["n_duplicates"] == 6  # a's 3 runs again from the CSV and from the copy
    assert len(result["rows"]) == 6 and all(row["has_metrics"] for row in result["rows"])
    counts = {(row["seq_len"], row["r"]): (row["n_generalized"], row["n_seeds"]) for row in result["table"]}
    assert counts == {(5, 0.9): (1, 2), (5, 0.5): (0, 1), (8, 0.9): (1, 1), (8, 0.5): (2, 2)}
    assert "counted once" in capsys.readouterr().out
    # a CSV row of a run is replaced by the run directory's fresh outcome
    rows, dropped = merge_runs([read_outcomes_csv(a / "outcomes.csv"), write_report(a, print_table=False)["rows"]])
    assert dropped == 3 and all(row["has_metrics"] for row in rows)
    # runs with one directory name but other settings are different runs
    other = make_study(tmp_path / "other", [("x_r9", 0.9, [GEN, GEN], {"lr": 3e-4})])
    merged = write_report_sources([a, other], tmp_path / "merged2", print_table=False)
    assert merged["n_duplicates"] == 0 and len(merged["rows"]) == 5


def test_sources_are_checked_before_any_work(tmp_path):
    study = make_study(tmp_path / "study", [("x", 0.9, [GEN], {})])
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.csv").write_text("task,r\nmax_parity_sum_parity,0.9\n")
    out = tmp_path / "out"
    for bad, needle in ((tmp_path / "notes.txt", "neither a study directory nor"),
                        (tmp_path / "empty", "no runs/ folder"),
                        (tmp_path / "missing", "does not exist")):
        with pytest.raises(UserError, match=needle) as err:
            write_report_sources([study, bad], out)
        assert str(bad) in str(err.value)
        assert not out.exists()
    with pytest.raises(UserError, match="lacks the columns"):
        write_report_sources([study, tmp_path / "bad.csv"], out)
    assert not out.exists()
    write_report(study, print_table=False)
    text = (study / "outcomes.csv").read_text().replace(",True,", ",Yes,", 1)
    (tmp_path / "typo.csv").write_text(text)
    with pytest.raises(UserError, match=r"typo.csv line 2: column \w+ holds 'Yes'"):
        read_outcomes_csv(tmp_path / "typo.csv")


# ---------------------------------------------------------------- the rate figure

def _table_rows(spec):
    rows = []
    for (layers, seq_len, r), (k, n) in spec.items():
        low, high = _wilson(k, n)
        rows.append({"task": "max_parity_sum_parity", "seq_len": seq_len, "n_layers": layers, "n_heads": 2,
                     "weight_decay": 0.1, "r": r, "n_seeds": n, "rate": k / n, "wilson_low": low,
                     "wilson_high": high})
    return rows


def _joins_points(line) -> bool:
    xs = list(line.get_xdata())
    return len(set(xs)) > 1 and line.get_linestyle() not in ("None", "none", "", " ")


@pytest.mark.parametrize("x_axis", ["full", "categorical"])
def test_rate_figure_draws_markers_never_lines_between_r(x_axis):
    rows = _table_rows({(1, 5, 0.1): (0, 8), (1, 5, 0.5): (3, 8), (1, 5, 0.9): (1, 8), (2, 5, 0.5): (0, 8),
                        (2, 5, 0.9): (6, 8), (2, 8, 0.9): (2, 8), (2, 8, 0.5): (0, 8)})
    fig = plot_rate_vs_r(rows, x_axis=x_axis)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert not [line for line in ax.lines if _joins_points(line)]
    # error bars: vertical segments only
    for collection in ax.collections:
        for segment in collection.get_segments():
            assert segment[0][0] == pytest.approx(segment[-1][0])
    # one colour per architecture: the 2-layer regimes share one, differ from the 1-layer one;
    # each regime (length 5, length 8) has its own marker shape
    colours: dict[str, set] = {}
    markers: dict[str, set] = {}
    for container in ax.containers:
        data_line = container.lines[0]
        arch = container.get_label()[:2]
        colours.setdefault(arch, set()).add(data_line.get_color())
        markers.setdefault(arch, set()).add(data_line.get_marker())
    assert len(ax.containers) == 3
    assert len(colours["1L"]) == 1 and len(colours["2L"]) == 1 and colours["1L"] != colours["2L"]
    assert len(markers["2L"]) == 2
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "1L 2H: n = 8 seeds per r" in labels and "2L 2H: n = 8 seeds per r" in labels
    assert "seq_len 5" in labels and "seq_len 8" in labels
    # dashed chance line at r = 1/2 (the parity task's 1/m)
    chance = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(chance) == 1
    if x_axis == "full":
        assert ax.get_xlim() == (0.0, 1.0)
        assert list(chance[0].get_xdata()) == [0.5, 0.5]
    else:
        assert list(chance[0].get_xdata()) == [1.0, 1.0]  # the category of r = 0.5 (0.1, 0.5, 0.9)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "0.5", "0.9"]


def test_rate_figure_categorical_without_chance_in_data_has_no_chance_line():
    fig = plot_rate_vs_r(_table_rows({(1, 5, 0.7): (1, 4), (1, 5, 0.9): (0, 4)}), x_axis="categorical")
    assert not [line for line in fig.axes[0].lines if line.get_linestyle() == "--"]
    with pytest.raises(UserError, match="'log'"):
        plot_rate_vs_r(_table_rows({(1, 5, 0.9): (0, 4)}), x_axis="log")


# ---------------------------------------------------------------- a known 2x2

def _wilson(k, n, z=1.959963984540054):
    # Wilson (1927) in the closed form of Newcombe (1998), method 3:
    # (2np + z^2 -/+ z sqrt(z^2 + 4npq)) / (2(n + z^2))
    p, q = k / n, 1 - k / n
    root = z * math.sqrt(z * z + 4 * n * p * q)
    return (2 * n * p + z * z - root) / (2 * (n + z * z)), (2 * n * p + z * z + root) / (2 * (n + z * z))


def test_known_two_by_two_through_report(tmp_path, capsys):
    # cell a: 0 of 8 generalized; cell b: 6 of 8
    study = make_study(tmp_path, [("a", 0.5, [STUCK] * 8, {"n_layers": 2}),
                              ("b", 0.9, [GEN] * 6 + [STUCK] * 2, {"n_layers": 2})])
    result = write_report(study, compare=[("L=2,r=0.5", "L=2,r=0.9")])
    paper = result["comparisons"][0]
    assert (paper["k_a"], paper["n_a"], paper["k_b"], paper["n_b"]) == (0, 8, 6, 8)
    # Newcombe method 10: d -/+ sqrt of the squared Wilson half-widths on the inner sides
    l_a, u_a = _wilson(0, 8)
    l_b, u_b = _wilson(6, 8)
    d = 0 - 0.75
    low = d - math.sqrt((0 - l_a) ** 2 + (u_b - 0.75) ** 2)
    high = d + math.sqrt((u_a - 0) ** 2 + (0.75 - l_b) ** 2)
    assert (paper["difference"], paper["newcombe_low"], paper["newcombe_high"]) == pytest.approx((d, low, high))
    assert (low, high) == pytest.approx((-0.9285, -0.2795), abs=1e-4)  # worked by hand
    p = fisher_exact([[0, 8], [6, 2]], alternative="two-sided").pvalue
    assert paper["fisher_p"] == pytest.approx(p, rel=1e-12)
    assert p == pytest.approx(2 * math.comb(8, 6) * math.comb(8, 0) / math.comb(16, 6))  # two equal tails
    # the automatic contrast is the same pair, higher r first
    (contrast,) = result["contrasts"]
    assert (contrast["r_a"], contrast["difference"], contrast["fisher_p"]) == (0.9, 0.75, pytest.approx(p))
    assert (contrast["newcombe_low"], contrast["newcombe_high"]) == pytest.approx((-high, -low))
    row = _read_csv(result["paths"]["contrasts_csv"])[0]
    assert float(row["newcombe_low"]) == pytest.approx(-high) and float(row["fisher_p"]) == pytest.approx(p)
    printed = capsys.readouterr().out
    assert "[-0.93, -0.28]" in printed and f"{p:.3g}" in printed
    markdown = result["paths"]["table_md"].read_text()
    assert "| 0/8 |" in markdown and "| 6/8 |" in markdown and "[-0.93, -0.28]" in markdown
    assert markdown.startswith("Settings of every cell: seq_len 5, n_values 10, n_train 4096, n_eval 512, "
                               "data_seed 0, d_model 64, d_mlp 128, lr 0.001, epochs 300, batch_size full, "
                               "eval_every 20, early_stop no, threshold 1, train.betas 0.9/0.98, "
                               "train.lr_schedule constant, train.min_lr_ratio 0, train.warmup_steps 0.")
    assert "every cell: seq_len 5" in printed


def test_older_outcomes_csv_without_regime_columns_still_reports(tmp_path):
    study = make_study(tmp_path / "study", [("a", 0.9, [GEN, STUCK, GEN], {}), ("b", 0.5, [STUCK], {})])
    new = write_report(study, print_table=False)
    rows = _read_csv(new["paths"]["outcomes_csv"])
    old_columns = [k for k in rows[0] if k not in REGIME_FIELDS]  # the columns reports wrote before
    old_csv = tmp_path / "old_outcomes.csv"
    with open(old_csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=old_columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    result = write_report_sources([old_csv], tmp_path / "old_report", print_table=False)
    assert [(row["r"], row["n_generalized"], row["n_seeds"]) for row in result["table"]] == [
        (row["r"], row["n_generalized"], row["n_seeds"]) for row in new["table"]]
    assert all(row["seq_len"] is None for row in result["table"])
    assert all(row["steps"] is None for row in result["table"])  # no n_train, no epochs: no clock
    # none of the regime is known; the betas and the lr shape read as TrainConfig's defaults, the only
    # ones any version had
    assert result["paths"]["table_md"].read_text().startswith(
        "Settings of every cell: train.betas 0.9/0.98, train.lr_schedule constant, train.min_lr_ratio 0, "
        "train.warmup_steps 0.\n")


def test_calibration_and_final_studies_stay_apart_at_equal_settings(tmp_path):
    """Two studies with the same settings but different names (a calibration and the final
    study) give two cells, and their names come back from the merged outcomes.csv."""
    from interp_toolkit.io import atomic_write_json
    from interp_toolkit.studies.grid.outcome_table import read_outcomes_csv
    from interp_toolkit.studies.grid.study import read_study_name
    from interp_toolkit.studies.report.write import write_report_sources
    from tests.studies.fakes import GEN, STUCK, make_study

    studies = {}
    for name, curves in (("calibration", [GEN, STUCK]), ("final", [GEN, GEN, GEN])):
        root = make_study(tmp_path / name, [("c", 0.9, curves, {})])
        atomic_write_json(root / "study.json", {"config": {"name": name}})
        studies[name] = root
    assert read_study_name(studies["final"]) == "final"
    report = write_report_sources([studies["calibration"], studies["final"]], tmp_path / "out", print_table=False)
    by_study = {row["study"]: row for row in report["table"]}
    assert set(by_study) == {"calibration", "final"}
    assert (by_study["calibration"]["n_generalized"], by_study["calibration"]["n_seeds"]) == (1, 2)
    assert (by_study["final"]["n_generalized"], by_study["final"]["n_seeds"]) == (3, 3)
    rows = read_outcomes_csv(tmp_path / "out" / "outcomes.csv")
    assert sorted({row["study"] for row in rows}) == ["calibration", "final"]
    # a comparison names a study's cell by the study's name
    assert find_cell(report["table"], "study=final,r=0.9")["n_seeds"] == 3
    assert find_cell(report["table"], "study=calibration")["n_seeds"] == 2
    with pytest.raises(UserError, match="ambiguous.*study"):
        find_cell(report["table"], "r=0.9")
