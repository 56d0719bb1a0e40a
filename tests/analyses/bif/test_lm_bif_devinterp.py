"""Our estimator on devinterp's own draws reproduces devinterp's token-wise BIF (optional extra)."""

import numpy as np
import pytest
import torch

from interp_toolkit.analyses.bif import CoMoments
from interp_toolkit.analyses.bif.lm_tokens import next_token_losses

torch.set_num_threads(1)


def test_estimator_matches_devinterp_on_its_draws(tmp_path):
    pytest.importorskip("devinterp")
    from datasets import Dataset
    from devinterp.slt.bif import compute_bif
    from devinterp.slt.sampling import sample
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from interp_toolkit.sources import CheckpointRef

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=11, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=8)
    GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "m")
    model = CheckpointRef("hf_local", str(tmp_path / "m")).load()
    gen = torch.Generator().manual_seed(0)
    pool = torch.randint(0, 11, (32, 8), generator=gen)
    rec = pool[:4]
    samples = sample(model, Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch"),
                     {"rec": (Dataset.from_dict({"input_ids": rec.tolist()}).with_format("torch"), 1)},
                     lr=1e-3, n_beta=10.0, localization=100.0, num_chains=2, num_draws=6, batch_size=4,
                     num_burnin_steps=0, device="cpu", loss_fn=next_token_losses)
    theirs = np.asarray(compute_bif(samples, correlation_method="token", compute_covariance=True,
                                    device="cpu")["influences"].values, dtype=np.float64)
    draws = torch.from_numpy(np.asarray(samples.dataset["loss_rec"].values, dtype=np.float64))
    n = draws.shape[0] * draws.shape[1]
    flat = draws.reshape(n, -1)
    ours = -CoMoments.from_batch(flat, flat).covariance()  # -Cov, 1/N
    t = draws.shape[-1]
    aligned = -torch.from_numpy(theirs.transpose(0, 2, 1, 3).reshape(4 * t, 4 * t)) * (n - 1) / n
    assert ours.abs().max() > 0
    torch.testing.assert_close(ours, aligned, rtol=1e-4, atol=1e-6)


def test_devinterp_pearson_convention_equals_devinterp_on_its_draws(tmp_path):
    """``pearson_convention="token_mean"`` = devinterp's ``average_tokenwise_bif`` correlation."""
    pytest.importorskip("devinterp")
    from datasets import Dataset
    from devinterp.slt.bif import compute_bif
    from devinterp.slt.sampling import sample
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from interp_toolkit.analyses.bif.lm_estimate import compute_lm_bif
    from interp_toolkit.analyses.bif.lm_tokens import TokenSet
    from interp_toolkit.sources import CheckpointRef

    torch.manual_seed(1)
    cfg = GPTNeoXConfig(vocab_size=11, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=8)
    GPTNeoXForCausalLM(cfg).save_pretrained(tmp_path / "m")
    model = CheckpointRef("hf_local", str(tmp_path / "m")).load()
    pool = torch.randint(0, 11, (32, 8), generator=torch.Generator().manual_seed(1))
    samples = sample(model, Dataset.from_dict({"input_ids": pool.tolist()}).with_format("torch"),
                     {"rec": (Dataset.from_dict({"input_ids": pool[:4].tolist()}).with_format("torch"), 1)},
                     lr=1e-3, n_beta=10.0, localization=100.0, num_chains=3, num_draws=8, batch_size=4,
                     num_burnin_steps=0, device="cpu", loss_fn=next_token_losses)
    theirs = torch.from_numpy(np.asarray(compute_bif(samples, correlation_method="token", average_tokenwise_bif=True,
                                                     device="cpu")["influences"].values, dtype=np.float64))
    draws = torch.from_numpy(np.asarray(samples.dataset["loss_rec"].values, dtype=np.float64))  # chain draw batch pos
    chains, n_draws = draws.shape[:2]
    ids = torch.from_numpy(np.asarray(samples.dataset["input_ids_rec"].values)).reshape(-1, 8)[-4:].long()
    rec = TokenSet(ids)
    flat = draws.reshape(chains, n_draws, -1)
    ours = compute_lm_bif(flat, None, rec, None, ("sequence:sequence", "token:token", "all:all"), pearson=True,
                          pearson_convention="token_mean")
    assert theirs.shape == (4, 4) and theirs.abs().max() > 0.01
    torch.testing.assert_close(ours["sequence:sequence"].bif, -theirs, rtol=1e-4, atol=1e-5)
    # the other convention is a different number (correlation of sequence-mean losses) ...
    other = compute_lm_bif(flat, None, rec, None, ("sequence:sequence", "token:token"), pearson=True,
                           pearson_convention="group_means")
    assert (other["sequence:sequence"].bif - ours["sequence:sequence"].bif).abs().max() > 1e-2
    # ... while both agree on single tokens (plain -Corr)
    torch.testing.assert_close(other["token:token"].bif, ours["token:token"].bif, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ours["all:all"].bif, -theirs.mean().reshape(1, 1), rtol=1e-4, atol=1e-5)
