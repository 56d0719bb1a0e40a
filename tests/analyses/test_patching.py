import math

import pytest
import torch
import transformer_lens.patching as tl_patching

from interp_toolkit.analyses.ablation import resolve_components
from interp_toolkit.analyses.patching import (
    GAP_RTOL,
    activation_patching,
    compute_patching,
    minimal_pair_patching,
    normalize_patching,
    readout_metric,
    resample_ablation_damage,
)
from interp_toolkit.errors import UserError


@pytest.mark.parametrize("source, target", [("val", "adv"), ("adv", "val")])
def test_minimal_pairs_find_the_parity_circuit_not_the_shortcut_head(hand_parity_model, splits, source, target):
    # head 0 + MLP compute the sum parity; head 1 reads the max parity, equal within a pair
    result = minimal_pair_patching(hand_parity_model, splits, source=source, target=target, positions=None)
    norm = {r["component"]: r["normalized"] for r in result.rows}
    assert norm["L0H0"] == pytest.approx(1.0, abs=1e-3)
    assert norm["mlp0"] == pytest.approx(1.0, abs=1e-3)
    assert norm["attn0"] == pytest.approx(1.0, abs=1e-3)
    assert norm["resid_pre0"] == pytest.approx(1.0, abs=1e-3)
    assert norm["L0H1"] == pytest.approx(0.0, abs=1e-3)
    row = result.rows[0]
    # the model predicts the sum parity: each run favours its own label by a clear margin
    assert row["source"] > 1.0 and row["target"] < -1.0
    assert row["source_split"] == source and row["target_split"] == target
    assert row["metric"] == "pair_logit_diff" and result.config["n"] == row["n_pairs"] == 128


def test_minimal_pairs_by_position_find_the_readout_and_the_changed_token(hand_parity_model, splits):
    result = minimal_pair_patching(hand_parity_model, splits, components=["L0H0", "resid_pre0"], n=64)
    norm = {(r["component"], r["position"]): r["normalized"] for r in result.rows}
    assert norm[("L0H0", 5)] == pytest.approx(1.0, abs=1e-3)  # the head is read at the readout
    assert all(abs(norm[("L0H0", p)]) < 1e-3 for p in range(5))
    # one changed token per pair: patching the residual at one value position moves the
    # metric only for the pairs whose change sits there; the shares add up to the whole
    shares = [norm[("resid_pre0", p)] for p in range(5)]
    assert all(-1e-3 <= share <= 1 + 1e-3 for share in shares)
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert abs(norm[("resid_pre0", 5)]) < 1e-3  # the readout token is the same in both


def test_minimal_pairs_cannot_move_a_pure_shortcut_model(hand_model, splits):
    # the max-parity model sees the same shortcut in source and target: nothing to move, so
    # normalized would divide by ~0; it is left blank with a warning naming the entries
    with pytest.warns(UserWarning, match=r"normalized is NaN for all 2 entries"):
        result = minimal_pair_patching(hand_model, splits, components=["L0H0", "L0H1"], positions=None, n=32)
    for row in result.rows:
        assert row["source"] == pytest.approx(row["target"], abs=1e-4)
        assert row["gap"] == pytest.approx(row["source"] - row["target"])
        assert math.isnan(row["normalized"]) and math.isfinite(row["patched"])
    assert torch.isnan(result.tensors["normalized"]).all()


def test_normalized_is_blank_under_the_gap_tolerance():
    """The reported case: source 2.326 vs target 2.388 turned a 0.062 shift into 'full transfer'."""
    patched = torch.tensor([[2.326, 2.40, 2.6]])
    with pytest.warns(UserWarning, match=r"differ by -0\.062.*all 3 entries"):
        blank = normalize_patching(patched, source=2.326, target=2.388)
    assert torch.isnan(blank).all()
    # a clear gap is normalized as before, without a warning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clear = normalize_patching(torch.tensor([[0.0, 1.0, 2.0]]), source=2.0, target=0.0)
    assert clear.tolist() == [[0.0, 0.5, 1.0]]
    # the tolerance is relative to the larger metric (GAP_RTOL) and can be set per call
    just_above = 2.0 * GAP_RTOL * 1.01
    assert not torch.isnan(normalize_patching(torch.zeros(1, 1), source=2.0, target=2.0 - just_above)).any()
    with pytest.warns(UserWarning):
        normalize_patching(torch.zeros(1, 1), source=2.0, target=1.5, gap_rtol=0.5)
    with pytest.raises(UserError, match="gap_atol must be a number >= 0, got -1"):
        normalize_patching(torch.zeros(1, 1), source=2.0, target=0.0, gap_atol=-1)


def test_plot_breaks_lines_at_blank_normalized_values(tmp_path):
    from interp_toolkit.analyses._common import Table
    from interp_toolkit.analyses.over_checkpoints import ANALYSES, plot_over_checkpoints
    from interp_toolkit.io import append_jsonl

    for epoch in (1, 2, 4, 8):
        append_jsonl(tmp_path / "metrics.jsonl", {"epoch": epoch, "val_acc": 0.5, "adv_acc": 0.5})
    nan = float("nan")
    rows = [{"epoch": e, "component": c, "position": -1, "normalized": v}
            for e, values in ((1, (0.1, nan)), (2, (nan, nan)), (4, (0.9, nan)), (8, (1.0, nan)))
            for c, v in zip(("L0H0", "L0H1"), values)]
    import dataclasses

    # the line renderer (patching draws heatmaps by default; see the next test)
    fig = plot_over_checkpoints(Table(rows), tmp_path, dataclasses.replace(ANALYSES["patching"], heatmaps=False,
                                                                            value_columns=("normalized",)))
    panel = fig.axes[1]
    lines = {line.get_label(): line for line in panel.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"L0H0 -1"}  # a component blank at every checkpoint draws nothing
    ys = list(lines["L0H0 -1"].get_ydata())
    assert len(ys) == 4 and math.isnan(ys[1])  # the blank epoch breaks the line, not bridged
    fig.savefig(tmp_path / "patching.png")


def test_patching_figure_draws_every_cell_of_the_chosen_checkpoints(tmp_path):
    import numpy as np

    from interp_toolkit.analyses._common import Table
    from interp_toolkit.analyses.heatmaps import chosen_epochs
    from interp_toolkit.analyses.over_checkpoints import ANALYSES, plot_over_checkpoints
    from interp_toolkit.io import append_jsonl
    from interp_toolkit.plotting import MAX_PIXELS, save_figure

    epochs = [0, 1, 2, 4, 8, 16, 32, 64, 100]
    for epoch in epochs:
        append_jsonl(tmp_path / "metrics.jsonl", {"epoch": epoch, "val_acc": 0.5, "adv_acc": 0.5})
    components = [f"L{layer}H{head}" for layer in range(2) for head in range(2)] + ["attn0", "mlp0"]
    rows = [{"epoch": e, "component": c, "position": p, "change": e + 10 * i + 0.1 * p,
             "normalized": float("nan") if e >= 64 else 0.01 * (i + p)}
            for e in epochs for i, c in enumerate(components) for p in range(11)]
    fig = plot_over_checkpoints(Table(rows), tmp_path, ANALYSES["patching"])
    assert fig.heatmap_epochs == chosen_epochs(epochs) and len(fig.heatmap_epochs) == 6
    assert fig.heatmap_epochs[0] == 0 and fig.heatmap_epochs[-1] == 100
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2 * 6  # change and normalized, at every chosen checkpoint: no series left out
    first = np.ma.getdata(images[0].get_array())
    assert first.shape == (6, 11) and first[2, 3] == 0 + 10 * 2 + 0.3  # rows: components, columns: positions
    last_normalized = images[-1].get_array()
    assert np.ma.getmaskarray(last_normalized).all()  # blank cells stay blank, not 0
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles[-1] == "epoch 100\n(blank: |gap| under the tolerance)"
    limits = {image.get_clim() for image in images[:6]}
    assert len(limits) == 1 and limits.pop()[0] < 0  # one symmetric scale per row
    from PIL import Image

    path = save_figure(fig, tmp_path / "patching.png")
    assert max(Image.open(path).size) <= MAX_PIXELS


def test_minimal_pair_patching_bad_input(hand_parity_model, splits):
    with pytest.raises(UserError, match="mixes shortcut-consistent"):
        minimal_pair_patching(hand_parity_model, splits, source="train", target="adv")
    with pytest.raises(UserError, match="must differ"):
        minimal_pair_patching(hand_parity_model, splits, source="val", target="val")
    with pytest.raises(UserError, match="split 'x' not found"):
        minimal_pair_patching(hand_parity_model, splits, source="x")


def test_resample_damage_of_the_max_head_moves_the_metric_fully(hand_model, splits):
    result = resample_ablation_damage(hand_model, splits, source="val", target="adv", positions=None)
    norm = {r["component"]: r["normalized"] for r in result.rows}
    assert norm["L0H0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["attn0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["resid_pre0"] == pytest.approx(1.0, abs=1e-5)
    assert norm["L0H1"] == pytest.approx(0.0, abs=1e-5)
    row = result.rows[0]
    assert row["source"] != row["target"]
    assert row["source_split"] == "val" and row["target_split"] == "adv"


def test_resample_damage_by_position_finds_the_readout(hand_model, splits):
    result = resample_ablation_damage(hand_model, splits, components=["L0H0"], positions="each", n=64)
    norm = {r["position"]: r["normalized"] for r in result.rows}
    assert norm[5] == pytest.approx(1.0, abs=1e-5)  # the head's output is read at the readout
    assert all(abs(norm[p]) < 1e-5 for p in range(5))
    assert result.tensors["normalized"].shape == (1, 6)


@pytest.mark.parametrize("model_name", ["hand_model", "small_trained_like_model"])
def test_agrees_with_transformer_lens_patching(model_name, request, splits):
    model = request.getfixturevalue(model_name)
    model.eval()
    source, target = splits["val"].tokens[:48], splits["adv"].tokens[:48]
    metric = readout_metric("logit_diff", splits["adv"].labels[:48])
    _, source_cache = model.run_with_cache(source)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads

    resid = compute_patching(model, target, source_cache, resolve_components(
        model, [f"resid_pre{layer}" for layer in range(n_layers)]), list(range(6)), metric)
    tl_resid = tl_patching.get_act_patch_resid_pre(model, target, source_cache, metric)
    torch.testing.assert_close(resid, tl_resid.float(), atol=1e-5, rtol=1e-4)

    heads = [f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)]
    by_pos = compute_patching(model, target, source_cache, resolve_components(model, heads), list(range(6)), metric)
    tl_by_pos = tl_patching.get_act_patch_attn_head_out_by_pos(model, target, source_cache, metric)
    # TL: [layer, pos, head]; ours: [layer*head, pos]
    torch.testing.assert_close(by_pos, tl_by_pos.permute(0, 2, 1).reshape(-1, 6).float(), atol=1e-5, rtol=1e-4)

    attn = compute_patching(model, target, source_cache, resolve_components(
        model, [f"attn{layer}" for layer in range(n_layers)]), list(range(6)), metric)
    tl_attn = tl_patching.get_act_patch_attn_out(model, target, source_cache, metric)
    torch.testing.assert_close(attn, tl_attn.float(), atol=1e-5, rtol=1e-4)

    all_pos = compute_patching(model, target, source_cache, resolve_components(model, heads), None, metric)
    tl_all = tl_patching.get_act_patch_attn_head_out_all_pos(model, target, source_cache, metric)
    torch.testing.assert_close(all_pos[:, 0], tl_all.reshape(-1).float(), atol=1e-5, rtol=1e-4)


def test_patching_bad_input(hand_model, splits):
    with pytest.raises(UserError, match="split 'x' not found"):
        resample_ablation_damage(hand_model, splits, source="x")
    with pytest.raises(UserError, match="metric must be one of"):
        resample_ablation_damage(hand_model, splits, metric="kl")
    with pytest.raises(UserError, match="one shape"):
        activation_patching(hand_model, splits["val"].tokens[:4], splits["adv"].tokens[:5],
                            splits["adv"].labels[:4])
    with pytest.raises(UserError, match="positions must be"):
        resample_ablation_damage(hand_model, splits, positions="last")
    with pytest.raises(UserError, match="positions must be"):
        minimal_pair_patching(hand_model, splits, positions="last")
