"""interp_toolkit.studies.rounding_probe: every numerics mode stays on one trajectory for a few
steps from the same start, and the near-miss view and the continuation are of the mode's own
weights."""

import pytest

from interp_toolkit.errors import UserError
from interp_toolkit.studies import rounding_probe as probe
from interp_toolkit.tasks.mpsp import MPSPConfig, is_extreme_count, make_splits


def test_every_mode_agrees_for_a_few_steps_and_names_its_failing_groups(monkeypatch):
    task = MPSPConfig.from_task("max_parity_sum_parity", r=0.9, seq_len=6, n_values=10, n_train=256, n_eval=128,
                                seed=0)
    monkeypatch.setattr(probe, "NEAR_MISS_FROM", 0.0)  # name the failing groups at any accuracy
    finals = {mode: probe.probe(mode, 3, 1, task, batch_size=64, weight_decay=1.0)[-1] for mode in probe.MODES}
    assert {row["epoch"] for row in finals.values()} == {1}
    for row in finals.values():  # 4 steps from one start: every mode agrees to within one example
        for split, n in (("train", 256), ("adv", 128)):
            assert abs(row[f"{split}_acc"] - finals["toolkit"][f"{split}_acc"]) <= 1 / n + 1e-9
        # the near-miss view is of the mode's own weights (bare ones copied back into the toolkit model)
        assert row["adv_wrong"] == round((1 - row["adv_acc"]) * 128)
        assert "wrong)" in row["adv_failing_groups"]
    with pytest.raises(UserError, match="mode must be one of"):
        probe.probe("float16", 3, 1, task)

    # the continuation: one more epoch on a training split holding exactly 6 all-odd sequences
    rows = probe.probe("toolkit", 3, 1, task, batch_size=64, then_extreme_train=6, then_epochs=1)
    assert [(r["epoch"], r.get("continued", False)) for r in rows] == [(1, False), (2, True)]
    assert rows[1]["extreme_train"] == 6
    extreme = is_extreme_count(make_splits(task)["adv"].values, 2)
    assert extreme.any()  # so the extreme-count accuracy is a number
    assert 0.0 <= rows[1]["adv_extreme_acc"] <= 1.0
    count = rows[1]["adv_extreme_acc"] * int(extreme.sum())
    assert count == pytest.approx(round(count))
