"""``report`` on conflicting, out-of-range, foreign and unreadable inputs: exit 2 naming the file."""

from __future__ import annotations

import csv
import json

import pytest

from interp_toolkit.cli import main
from interp_toolkit.studies.report.write import write_report
from tests.studies.fakes import GEN, STUCK, make_study


@pytest.fixture
def reported(tmp_path):
    """A study of two r = 0.9 runs (one generalizes, one does not) and its outcomes.csv."""
    study = make_study(tmp_path / "study", [("c_r9", 0.9, [GEN, STUCK], {})])
    write_report(study, print_table=False)
    return study, study / "outcomes.csv"


def _rows(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _write(path, header, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _flipped(rows):
    return [{**row, "generalized": str(row["generalized"] != "True")} for row in rows]


def test_conflicting_copies_are_refused_unless_a_source_is_preferred(reported, tmp_path, capsys):
    _, table = reported
    header, rows = _rows(table)
    generalized = {row["run_dir"].rsplit("/", 1)[-1]: row["generalized"] for row in rows}
    assert sorted(generalized.values()) == ["False", "True"]
    out = tmp_path / "out"
    # one file holding each run twice with opposite outcomes: row order used to decide
    for order in (rows + _flipped(rows), _flipped(rows) + rows):
        both = _write(tmp_path / "both.csv", header, order)
        assert main(["report", str(both), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: run c_r9_s") and "conflicting copies" in err and str(both) in err
        assert "--prefer" in err and len(err.strip().splitlines()) == 1
        # preferring the file does not settle copies that conflict within it
        assert main(["report", str(both), "--out", str(out), "--prefer", str(both)]) == 2
        assert "itself holds conflicting copies" in capsys.readouterr().err
    # two files that disagree: refused, naming both; --prefer picks the winner either way
    other = _write(tmp_path / "other.csv", header, _flipped(rows))
    assert main(["report", str(table), str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(table) in err and str(other) in err
    for preferred, expected in ((table, generalized), (other, {k: str(v != "True") for k, v in generalized.items()})):
        assert main(["report", str(table), str(other), "--out", str(out), "--prefer", str(preferred)]) == 0
        capsys.readouterr()
        _, merged = _rows(out / "outcomes.csv")
        assert {row["run_dir"].rsplit("/", 1)[-1]: row["generalized"] for row in merged} == expected
    # a preferred path that is no source is named
    assert main(["report", str(table), str(other), "--out", str(out), "--prefer", str(tmp_path / "x.csv")]) == 2
    assert "x.csv is not one of the report's sources" in capsys.readouterr().err
    # identical copies still merge silently, and a study directory with its own table agrees
    same = _write(tmp_path / "same.csv", header, rows)
    study, _ = reported
    assert main(["report", str(table), str(same), str(study), "--out", str(out)]) == 0
    assert "(4 runs found in more than one source were counted once)" in capsys.readouterr().out


@pytest.mark.parametrize("column, value, expected", [
    ("r", "7.5", "expected a number in [0, 1]"),
    ("r", "nan", "expected a number in [0, 1]"),
    ("final_adv_acc", "1.1953", "expected a number in [0, 1]"),
    ("final_val_acc", "-0.1", "expected a number in [0, 1]"),
    ("generalized", "yes", "expected True or False"),
    ("seed", "1.5", "expected a whole number >= 0"),
    ("n_layers", "-2", "expected a whole number >= 0"),
    ("weight_decay", "inf", "expected a finite number >= 0"),
])
def test_out_of_range_csv_values_name_file_line_and_column(reported, tmp_path, capsys, column, value, expected):
    _, table = reported
    header, rows = _rows(table)
    rows[1][column] = value
    bad = _write(tmp_path / "bad.csv", header, rows)
    assert main(["report", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad} line 3: column {column} holds {value!r}; {expected}" in err
    assert not (tmp_path / "out").exists()


def test_cell_specs_refuse_nan_and_repeated_keys(reported, tmp_path, capsys):
    _, table = reported
    out = str(tmp_path / "out")
    assert main(["report", str(table), "--out", out, "--where", "r=0.5,r=0.9"]) == 2
    err = capsys.readouterr().err
    assert "sets r twice" in err and "--where r=A r=B" in err
    assert main(["report", str(table), "--out", out, "--where", "L=1,layers=1"]) == 2
    assert "sets layers twice" in capsys.readouterr().err
    assert main(["report", str(table), "--out", out, "--compare", "r=nan", "r=0.9"]) == 2
    assert "r='nan' is not a finite number" in capsys.readouterr().err
    # two specs are the way to say "either"
    assert main(["report", str(table), "--out", out, "--where", "r=0.5", "r=0.9"]) == 0


def test_foreign_sources_and_out_say_what_they_are(reported, tmp_path, capsys):
    study, table = reported
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    assert main(["report", str(study), "--out", str(a_file)]) == 2
    assert f"--out {a_file} is an existing file; expected a directory" in capsys.readouterr().err
    assert a_file.read_text() == "not a directory\n"
    (tmp_path / "plain").mkdir()
    assert main(["report", str(tmp_path / "plain")]) == 2
    assert "is a directory with no runs/ folder inside, not a study directory" in capsys.readouterr().err
    run_dir = next((study / "runs").iterdir())
    assert main(["report", str(run_dir)]) == 2
    assert "is a train run directory (it holds run.json)" in capsys.readouterr().err
    assert main(["report", "/dev/null", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "/dev/null is not a regular file" in err and "does not exist" not in err
    binary = tmp_path / "binary.csv"
    binary.write_bytes(table.read_bytes()[:200] + b"\xff\xfe\x00\x81" + table.read_bytes()[200:])
    assert main(["report", str(binary)]) == 2
    assert f"{binary} is not UTF-8 text" in capsys.readouterr().err


def test_garbage_study_record_is_named_and_garbage_outcome_cache_recomputed(reported, capsys):
    study, table = reported
    run_dir = sorted((study / "runs").iterdir())[0]
    good = json.loads((run_dir / "outcome.json").read_text())
    for garbage in (b"{\"generalized\": tru", b"\xff\xfe garbage", b"[1, 2]"):
        (run_dir / "outcome.json").write_bytes(garbage)
        assert main(["report", str(study)]) == 0
        err = capsys.readouterr().err
        assert f"note: {run_dir / 'outcome.json'} was unreadable" in err
        assert json.loads((run_dir / "outcome.json").read_text()) == good
    for garbage in (b"{\"config\": ", b"\x80\x81", b"\"a string\""):
        (study / "study.json").write_bytes(garbage)
        assert main(["report", str(study)]) == 2
        err = capsys.readouterr().err
        assert f"study record {study / 'study.json'}" in err and len(err.strip().splitlines()) == 1
