import pytest


def test_induction_phases_and_testbed_plot():
    from matplotlib.figure import Figure

    from interp_toolkit.studies.lm_testbed import induction_phases, plot_testbed_bif

    steps = [0, 100, 200, 300, 400, 500, 600]
    scores = [0.03, 0.03, 0.05, 0.40, 0.75, 0.80, 0.81]
    phases = induction_phases(steps, scores)
    assert phases["formation_step"] == 300 and phases["max_slope"] == pytest.approx(0.35 / 100)
    assert (phases["start"], phases["end"]) == (300, 400)  # 10% of the 0.78 rise reached at 300, 90% at 400
    with pytest.raises(ValueError, match="increasing"):
        induction_phases([0, 0], [0.1, 0.2])
    rows = [{"step": s, "induction_score": v, "reduction": "class:all", "train_group": c, "query_group": "all",
             "bif": str(0.01 * i * v), "stderr": "0.001"} for s, v in zip(steps, scores)
            for i, c in enumerate(["bos", "random", "induction"])]
    fig = plot_testbed_bif(rows)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["train random tokens", "train induction tokens"]
    assert any("formation" in t.get_text() and "300" in t.get_text() for t in ax.get_legend().get_texts())
    assert {t.get_text() for t in ax.texts} == {"before", "during", "after"}
    assert fig.axes[1].get_ylabel().startswith("induction score")
    other = Figure()
    target = other.add_subplot()
    assert plot_testbed_bif(rows, ax=target) is other
