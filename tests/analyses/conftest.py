"""Shared fixtures: hand-built models whose circuits are known by construction."""

from __future__ import annotations

import pytest
import torch

from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.tasks.mpsp import MPSPConfig, make_split

SEQ_LEN = 5
N_VALUES = 10

# One thread: the machines are shared, and OpenMP threads spinning on a busy 2-core box
# make each tiny matmul ~100x slower.
torch.set_num_threads(1)
ALPHA = 40.0  # query scale: readout-to-value scores are ALPHA * v / sqrt(d_head)


def hand_built_model():
    """1 layer, 2 heads, attention-only, no normalization, d_model 8, d_head 4, 2 classes.

    Residual dims: 0 = token value v, 1 = "is readout", 2 = parity sign (+1 odd, -1 even),
    3 = parity output read by the unembedding, 4 = "is position 0", 5 = unread scratch.

    * Head 0 (max-parity head): the readout queries dim 1, keys read dim 0, so its score to
      each position is ALPHA * v / 2 (grows with the value: it attends to the max); its OV
      copies the parity sign (dim 2) into dim 3, which the unembedding reads as
      logit(1) - logit(0). The model predicts max(values) mod 2.
    * Head 1 (first-position head): keys read dim 4 (position 0 only), so the readout
      attends to position 0; its OV writes into dim 5, which nothing reads.
    """
    cfg = ModelConfig(n_layers=1, n_heads=2, d_vocab=N_VALUES + 1, n_ctx=SEQ_LEN + 1, d_vocab_out=2,
                      d_model=8, d_head=4, normalization=None, attn_only=True)
    model = build_model(cfg)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for v in range(N_VALUES):
        sd["embed.weight"][v, 0] = float(v)
        sd["embed.weight"][v, 2] = 1.0 if v % 2 else -1.0
    sd["embed.weight"][N_VALUES, 1] = 1.0  # readout token
    sd["pos_embed.weight"][0, 4] = 1.0
    q, k, vw, o = (sd[f"blocks.0.attn.{x}.weight"] for x in "qkvo")
    # head 0: rows 0..3 of q/k/v, columns 0..3 of o
    q[0, 1] = ALPHA
    k[0, 0] = 1.0
    vw[0, 2] = 1.0
    o[3, 0] = 1.0
    # head 1: rows 4..7 of q/k/v, columns 4..7 of o
    q[4, 1] = ALPHA
    k[4, 4] = 1.0
    vw[4, 2] = 1.0
    o[5, 4] = 1.0
    sd["unembed.weight"][1, 3] = 1.0
    sd["unembed.weight"][0, 3] = -1.0
    model.load_state_dict(sd)
    model.eval()
    return model


def hand_built_parity_model():
    """1 layer, 2 heads + ReLU MLP, no normalization, d_model 8: a sum-parity circuit beside a
    max-parity (shortcut) head, both read by the unembedding.

    Residual dims: 0 = token value v, 1 = "is readout", 2 = parity sign (+1 odd, -1 even),
    3 = "is odd" (0/1), 4 = count of odd values (head 0), 5 = max parity sign (head 1),
    6 = sum parity sign (MLP), 7 = unused.

    * Head 0 (parity head): q = k = 0, so the readout attends uniformly to its SEQ_LEN + 1
      positions; its OV copies "is odd" times SEQ_LEN + 1 into dim 4: the count of odd values.
    * MLP: hidden unit j = relu(count - j); the output ``-1 + 2 h_0 - 4 h_1 + 4 h_2 - ...``
      is +1 for an odd count and -1 for an even one (sum parity), written to dim 6.
    * Head 1 (shortcut head): attends to the max value (as in :func:`hand_built_model`) and
      copies its parity sign into dim 5.
    * Unembedding: logit(1) - logit(0) = 4 * dim 6 + 1 * dim 5: the model predicts the sum
      parity, and the max parity shifts its margin.
    """
    cfg = ModelConfig(n_layers=1, n_heads=2, d_vocab=N_VALUES + 1, n_ctx=SEQ_LEN + 1, d_vocab_out=2,
                      d_model=8, d_head=4, d_mlp=8, normalization=None, act_fn="relu")
    model = build_model(cfg)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    for v in range(N_VALUES):
        sd["embed.weight"][v, 0] = float(v)
        sd["embed.weight"][v, 2] = 1.0 if v % 2 else -1.0
        sd["embed.weight"][v, 3] = float(v % 2)
    sd["embed.weight"][N_VALUES, 1] = 1.0  # readout token
    q, k, vw, o = (sd[f"blocks.0.attn.{x}.weight"] for x in "qkvo")
    # head 0 (rows 0..3 of q/k/v, columns 0..3 of o): uniform attention, copies "is odd"
    vw[0, 3] = 1.0
    o[4, 0] = float(SEQ_LEN + 1)
    # head 1 (rows 4..7, columns 4..7): attends to the max, copies its parity sign
    q[4, 1] = ALPHA
    k[4, 0] = 1.0
    vw[4, 2] = 1.0
    o[5, 4] = 1.0
    w_in, b_in, w_out = sd["blocks.0.mlp.in.weight"], sd["blocks.0.mlp.in.bias"], sd["blocks.0.mlp.out.weight"]
    for j in range(SEQ_LEN + 1):
        w_in[j, 4] = 1.0
        b_in[j] = -float(j)
        w_out[6, j] = 2.0 if j == 0 else 4.0 * (-1) ** j
    sd["blocks.0.mlp.out.bias"][6] = -1.0
    sd["unembed.weight"][1, 6], sd["unembed.weight"][0, 6] = 2.0, -2.0
    sd["unembed.weight"][1, 5], sd["unembed.weight"][0, 5] = 0.5, -0.5
    model.load_state_dict(sd)
    model.eval()
    return model


@pytest.fixture(scope="session")
def hand_parity_model():
    return hand_built_parity_model()


@pytest.fixture(scope="session")
def hand_model():
    return hand_built_model()


@pytest.fixture(scope="session")
def task():
    return MPSPConfig(seq_len=SEQ_LEN, n_values=N_VALUES, n_train=256, n_eval=128, r=0.75)


@pytest.fixture(scope="session")
def splits(task):
    """train (r = 0.75), val (r = 1: label = max parity) and adv (r = 0)."""
    return {
        "train": make_split(task, 0.75, 256, seed=1),
        "val": make_split(task, 1.0, 128, seed=2),
        "adv": make_split(task, 0.0, 128, seed=3),
    }


@pytest.fixture(scope="session")
def small_trained_like_model(task):
    """A 2-layer model with MLPs and LayerNorm (random init) for generic checks."""
    cfg = ModelConfig(n_layers=2, n_heads=2, d_vocab=task.d_vocab, n_ctx=task.n_ctx, d_vocab_out=2,
                      d_model=16, d_mlp=32, seed=3)
    model = build_model(cfg)
    model.eval()
    return model


@pytest.fixture(scope="session")
def neox_model(tmp_path_factory):
    """A tiny GPTNeoX (Pythia architecture) saved with transformers and booted locally."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=12, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=8, rotary_pct=0.25)
    path = tmp_path_factory.mktemp("neox")
    GPTNeoXForCausalLM(config).save_pretrained(path)
    model = TransformerBridge.boot_transformers(str(path), device="cpu")
    model.eval()
    return model
