import pytest

from interp_toolkit.errors import UserError


def test_induction_phases_and_testbed_plot():
    from matplotlib.figure import Figure

    from interp_toolkit.studies.lm.testbed import induction_phases, plot_testbed_bif

    steps = [0, 100, 200, 300, 400, 500, 600]
    scores = [0.03, 0.03, 0.05, 0.40, 0.75, 0.80, 0.81]
    phases = induction_phases(steps, scores)
    assert phases["formation_step"] == 300 and phases["max_slope"] == pytest.approx(0.35 / 100)
    assert (phases["start"], phases["end"]) == (300, 400)  # 10% of the 0.78 rise reached at 300, 90% at 400
    with pytest.raises(UserError, match="increasing"):
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
    fig.draw_without_rendering()  # the legend sits right of the data (and of the twin axis)
    assert ax.get_legend().get_window_extent().x0 >= fig.axes[1].get_window_extent().x1
    # a flat score is no measured transition: no phase bands, and the figure says why
    flat = [{**row, "induction_score": 0.03 + 0.001 * (row["step"] // 100)} for row in rows]
    flat_ax = plot_testbed_bif(flat).axes[0]
    assert len(ax.patches) == 3 and not flat_ax.patches  # the three phase bands, then none
    assert not {"before", "during", "after"} & {t.get_text() for t in flat_ax.texts}
    assert "no induction transition measured" in flat_ax.get_title()
    assert "no induction transition" not in ax.get_title()
    assert not any("formation" in t for t in flat_ax.get_legend_handles_labels()[1])


def test_train_testbed_runs_the_shared_training_steps(tmp_path):
    """``train_testbed`` and the calibration benchmark train with one function: the losses it
    logs and the weights it saves last are those of ``testbed_training_steps`` run alone."""
    import json
    import math

    import torch

    from interp_toolkit.studies.lm.testbed import (
        TestbedConfig,
        testbed_model,
        testbed_training_steps,
        train_testbed,
    )
    from interp_toolkit.tasks.induction_corpus import CorpusConfig

    corpus = CorpusConfig(n_sequences=32, seq_len=12, n_ordinary=6, chunk_min=2, chunk_max=4)
    cfg = TestbedConfig(corpus=corpus, n_layers=1, n_heads=1, d_model=8, d_mlp=16, total_steps=3, linear_every=2,
                        batch_size=4)
    refs = train_testbed(cfg, tmp_path / "tb", progress=False)
    model = testbed_model(cfg)
    yielded = list(testbed_training_steps(cfg, model))
    assert [s for s, _ in yielded] == [0, 1, 2, 3] and math.isnan(yielded[0][1])
    logged = json.loads((tmp_path / "tb" / "train_log.json").read_text())
    assert logged == [{"step": s, "loss": loss} for s, loss in yielded[1:]]
    assert [r.step for r in refs] == cfg.checkpoint_steps
    saved = type(model).from_pretrained(tmp_path / "tb" / "checkpoints" / "step000003")
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved.state_dict()[name]), name
