"""A campaign cut three times (twice by its budget, once by SIGTERM), each session on a fresh study
directory holding nothing but the campaign's state folder (a fresh clone of the committed state),
ends byte-identical to an uninterrupted sweep: every run's metrics.jsonl and checkpoints."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from interp_toolkit.cli import main
from interp_toolkit.errors import UserError
from interp_toolkit.runs import pause
from interp_toolkit.studies.grid.config import PRESETS, SweepConfig
from interp_toolkit.studies.sweep.campaign import (
    CAMPAIGN_LOG,
    STATUS_MD,
    campaign_status,
    parse_duration,
    run_campaign,
)
from interp_toolkit.studies.sweep.run import run_sweep


def _cfg(**changes) -> SweepConfig:
    data = {**PRESETS["smoke"], "ratios": [0.9], "seeds": [0, 1], "n_train": 64, "n_eval": 32, "d_model": 16,
            "d_mlp": 32, "epochs": 24, "eval_every": 4, "checkpoint_every": 8, "early_stop": False, **changes}
    return SweepConfig.from_dict(data)


class _Clock:
    """A clock that advances one second per reading: a budget of N seconds is N readings,
    so where a session pauses is fixed (pause.requested reads it once per epoch and job)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


class _SigtermAt:
    """Sends this process SIGTERM after the evaluation of ``epoch`` (as a scheduler would)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_evaluation(self, run_dir, metrics) -> None:
        if metrics["epoch"] == self.epoch:
            os.kill(os.getpid(), signal.SIGTERM)


def _files(study: Path) -> dict[str, bytes]:
    runs = study / "runs"
    return {f"{p.relative_to(runs)}": p.read_bytes() for p in sorted(runs.rglob("*"))
            if p.is_file() and (p.name == "metrics.jsonl" or p.parent.name == "checkpoints")}


def test_a_campaign_cut_three_times_on_fresh_machines_ends_as_an_uninterrupted_sweep(tmp_path, monkeypatch):
    cfg = _cfg()
    whole = run_sweep(cfg, tmp_path / "whole", workers=1, progress=False, report=False)
    assert len(whole.rows) == 2 and not whole.paused
    state = tmp_path / "state"
    monkeypatch.setattr(pause, "time", _Clock())
    epochs_seen = []
    for k, (budget, callbacks) in enumerate([(6.0, None), (5.0, None), (None, [_SigtermAt(16)])]):
        done = run_campaign(cfg, tmp_path / f"machine{k}", state, budget, workers=1, progress=False,
                            callbacks=callbacks)
        assert len(done["result"].paused) == 2 and not done["result"].rows  # cut before the horizon
        assert len(done["restored"]) == (0 if k == 0 else 2)  # every later session starts from the state alone
        rows = campaign_status(cfg, state)
        assert {row["state"] for row in rows} == {"paused"}
        epochs_seen.append(rows[0]["epochs_done"])
    # budget 6: the job's check, then epochs 1..5 (one reading each from epoch 2); budget 5: four more
    # (both states between evaluations, every 4 epochs); SIGTERM during epoch 16's evaluation: its end
    assert epochs_seen == [5, 9, 16]
    final = run_campaign(cfg, tmp_path / "machine3", state, None, workers=1, progress=False)
    assert len(final["result"].rows) == 2 and not final["result"].paused
    got, want = _files(tmp_path / "machine3"), _files(tmp_path / "whole")
    assert set(got) == set(want) and len(want) == 2 * (1 + 4)  # metrics + checkpoints 0, 8, 16, 24
    assert all(got[name] == want[name] for name in want), [n for n in want if got[n] != want[n]]
    rows = campaign_status(cfg, state)
    assert [row["state"] for row in rows] == ["finished", "finished"]
    assert [row["epochs_done"] for row in rows] == [24, 24] and all(r["core_hours_left"] == 0 for r in rows)
    for row in rows:  # the state keeps what continuing needs: no resume state once finished
        assert not (state / row["name"] / "resume.safetensors").exists()
        assert (state / row["name"] / "outcome.json").is_file()
    assert len(__import__("json").loads((state / CAMPAIGN_LOG).read_text())["sessions"]) == 4
    assert (state / STATUS_MD).read_text().count("| 1L |") == 2
    assert pause.requested() is None  # nothing left armed


def test_status_reports_the_criterion_and_the_cost_left(tmp_path, monkeypatch):
    cfg = _cfg(epochs=40, early_stop=True, n_train=256, d_model=32, d_mlp=64, eval_every=2, lr=0.01)
    state = tmp_path / "state"
    assert {row["state"] for row in campaign_status(cfg, state)} == {"not started"}
    run_campaign(cfg, tmp_path / "study", state, 0.0, workers=1, progress=False)  # spent before any job
    assert {row["state"] for row in campaign_status(cfg, state)} == {"not started"}
    monkeypatch.setattr(pause, "time", _Clock())
    run_campaign(cfg, tmp_path / "study", state, 3.0, workers=1, progress=False)
    rows = campaign_status(cfg, state)
    # budget 3: the job's check, epoch 2's, epoch 3's: paused at the end of epoch 2; the rate is measured
    assert [row["epochs_done"] for row in rows] == [2, 2]
    assert all(row["met_at"] is None and row["core_hours_left"] > 0 for row in rows)
    assert all(0.0 <= row["best_adv_acc"] <= 1.0 for row in rows)


def test_cli_campaign_status_and_bad_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pause, "time", _Clock())
    config = tmp_path / "c.yaml"
    config.write_text("sweep:\n  name: tiny\n  ratios: [0.9]\n  n_layers: [1]\n  n_heads: [2]\n  seeds: [0]\n"
                      "  n_train: 64\n  n_eval: 32\n"
                      "  d_model: 16\n  d_mlp: 32\n  epochs: 8\n  eval_every: 4\n")
    base = ["sweep", "--config", str(config), "--out", str(tmp_path / "study"), "--workers", "1", "--quiet"]
    assert main([*base, "--state", str(tmp_path / "state"), "--budget", "3s"]) == 0
    out = capsys.readouterr().out
    assert "1 paused" in out and "paused: rerun the same command" in out
    assert main([*base, "--state", str(tmp_path / "state"), "--status"]) == 0
    out = capsys.readouterr().out
    assert "| 1L | 0.9 | 0.1 | 0 | 2 / 8 |" in out and "not yet" in out
    assert main([*base, "--budget", "1h"]) == 2  # a budget needs the state that survives it
    assert "SweepCommandConfig.budget must be given with --state" in capsys.readouterr().err
    assert main([*base, "--state", str(tmp_path / "state"), "--budget", "soon"]) == 2
    assert "budget 'soon' is not a duration" in capsys.readouterr().err
    assert main([*base, "--state", str(tmp_path / "study" / "s")]) == 2
    assert "must lie outside the study directory" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [("2h30m", 9000), ("90m", 5400), ("45s", 45), ("1.5h", 5400),
                                               ("600", 600), ("1d", 86400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "1h 2m", "-5"])
def test_parse_duration_refuses(text):
    with pytest.raises(UserError, match="is not a duration"):
        parse_duration(text)


def test_a_state_further_along_replaces_a_stale_study_copy(tmp_path, monkeypatch):
    cfg = _cfg(epochs=12)
    state = tmp_path / "state"
    monkeypatch.setattr(pause, "time", _Clock())
    run_campaign(cfg, tmp_path / "a", state, 4.0, workers=1, progress=False)
    stale = tmp_path / "b"
    shutil.copytree(tmp_path / "a", stale)
    run_campaign(cfg, tmp_path / "a", state, 4.0, workers=1, progress=False)  # the state moves on
    done = run_campaign(cfg, stale, state, None, workers=1, progress=False)
    assert len(done["restored"]) == 2 and len(done["result"].rows) == 2
    whole = run_sweep(cfg, tmp_path / "whole", workers=1, progress=False, report=False)
    assert len(whole.rows) == 2
    assert _files(stale) == _files(tmp_path / "whole")
