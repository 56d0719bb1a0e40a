import math

import pytest
import torch
from transformer_lens import FactoredMatrix

from interp_toolkit.analyses.fingerprints import (
    compute_ov_fingerprint,
    compute_qk_fingerprint,
    fingerprints,
    full_ov_circuit,
    ov_circuit,
    pre_softmax_scores,
    qk_circuit,
)
from interp_toolkit.errors import UserError


def test_pre_softmax_scores_are_pre_softmax(hand_model, splits):
    tokens = splits["train"].tokens[:32]
    names = ("blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_pattern")
    _, cache = hand_model.run_with_cache(tokens, names_filter=lambda n: n in names)
    scores = pre_softmax_scores(cache[names[0]], cache[names[1]])
    pattern = cache[names[2]]
    # softmax of the scores is the model's attention pattern ...
    torch.testing.assert_close(scores.softmax(-1), pattern, atol=1e-5, rtol=1e-4)
    # ... and the scores themselves are not a distribution: the readout row of head 0 is
    # ALPHA * v / sqrt(d_head), far outside [0, 1]; the causal mask is -inf.
    finite = scores[torch.isfinite(scores)]
    assert finite.max() > 10
    readout_row = scores[:, 0, -1]
    expected = 40.0 * tokens.float() / 2.0
    expected[:, -1] = 0.0  # readout token has value dim 0
    torch.testing.assert_close(readout_row, expected)
    assert torch.isinf(scores[:, :, 0, 1:]).all()


def test_fingerprints_find_the_hand_built_circuits(hand_model, splits):
    result = fingerprints(hand_model, splits, split="train", modulus=2)
    by_head = {row["component"]: row for row in result.rows}
    max_head, first_head = by_head["L0H0"], by_head["L0H1"]
    assert max_head["score_source"] == "qk"
    # head 0: score grows with the value, OV writes parity
    assert max_head["qk_rho"] > 0.99 and max_head["qk_p"] < 1e-6
    assert max_head["ov_rho"] > 0.99
    assert max_head["ov_data_rho"] > 0.99
    # head 1: attends to position 0 whatever the value; writes nothing the unembedding reads
    assert abs(first_head["qk_rho"]) < 0.2
    assert first_head["first_share"] > 0.99
    assert max_head["first_share"] < 0.5
    assert not (first_head["ov_rho"] > 0.5)
    # tensors: readout scores per head; weights-based OV per value token
    assert result.tensors["scores"].shape == (1, 256, 2, 5)
    ov = result.tensors["ov_weights"][0, 0]
    parity = torch.arange(10) % 2
    assert torch.all((ov[:, 1] - ov[:, 0] > 0) == (parity == 1))


def test_ov_fingerprint_for_mod3_matches_one_vs_rest_definition():
    values = torch.arange(12)
    contrib = torch.nn.functional.one_hot(values % 3, 3).float() * 2.0 + 0.01 * values[:, None]
    rho, p = compute_ov_fingerprint(contrib, values, 3)
    assert rho > 0.8 and p < 0.01
    # a shuffled target destroys it
    rho_bad, _ = compute_ov_fingerprint(contrib, values.roll(1), 3)
    assert rho_bad < 0.2


def test_circuits_are_factored_matrices(hand_model):
    qk, ov = qk_circuit(hand_model, 0, 0), ov_circuit(hand_model, 0, 0)
    full = full_ov_circuit(hand_model, 0, 0)
    assert isinstance(qk, FactoredMatrix) and isinstance(ov, FactoredMatrix)
    assert full.shape == (11, 2)
    # full OV of the max head: odd values push class 1 up
    logits = full.AB
    assert logits[3, 1] - logits[3, 0] > 0 and logits[4, 1] - logits[4, 0] < 0


def test_fingerprints_bad_input(hand_model, splits):
    with pytest.raises(UserError, match="split 'nope' not found"):
        fingerprints(hand_model, splits, split="nope")
    with pytest.raises(UserError, match="modulus 5 exceeds"):
        fingerprints(hand_model, splits, modulus=5)
    with pytest.raises(UserError, match="layer 3"):
        fingerprints(hand_model, splits, layers=[3])


def test_fingerprints_run_on_boot_transformers_model(neox_model, splits):
    result = fingerprints(neox_model, splits, split="train", classes=[0, 1], n=64)
    assert len(result.rows) == 4  # 2 layers x 2 heads
    assert all(math.isfinite(r["qk_rho"]) and -1 <= r["qk_rho"] <= 1 for r in result.rows)
    assert {r["score_source"] for r in result.rows} <= {"qk", "attn_scores", "log_pattern"}
    assert all(0 <= r["first_share"] <= 1 for r in result.rows)


def test_qk_fingerprint_is_spearman_with_averaged_ties():
    # token values repeat, so ranks tie: the fingerprint must average them (scipy.stats.spearmanr)
    scores = torch.tensor([[0.1, 0.5, 0.5], [0.3, 0.2, 0.9]])
    values = torch.tensor([[1, 4, 4], [2, 1, 9]])
    rho, _ = compute_qk_fingerprint(scores, values)
    ranks_s = torch.tensor([1.0, 4.5, 4.5, 3.0, 2.0, 6.0])
    ranks_v = torch.tensor([1.5, 4.5, 4.5, 3.0, 1.5, 6.0])
    assert rho == pytest.approx(float(torch.corrcoef(torch.stack([ranks_s, ranks_v]))[0, 1]))
