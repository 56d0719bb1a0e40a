"""Library entry points refuse data they cannot measure, by name, before any work: float
token ids, tensors or a model on the meta device, and a model of another task than the data."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from interp_toolkit.analyses.ablation import ablation
from interp_toolkit.analyses.fingerprints import fingerprints
from interp_toolkit.analyses.gradients import gradient_conflict
from interp_toolkit.errors import UserError
from interp_toolkit.model import ModelConfig, build_model
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

torch.set_num_threads(1)

TASK = MPSPConfig(seq_len=4, n_values=6, n_train=64, n_eval=32)
ANALYSES = {
    "ablation": lambda model, splits: ablation(model, splits, split_names=["val"], n=16),
    "fingerprints": lambda model, splits: fingerprints(model, splits, n=16),
    "gradient_conflict": lambda model, splits: gradient_conflict(model, splits, n=16),
}


@pytest.fixture(scope="module")
def model_and_splits():
    model = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, **TASK.model_dims()))
    return model, make_splits(TASK)


def _with(splits, **changes):
    return {name: dataclasses.replace(split, **changes) for name, split in splits.items()}


@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_float_token_ids_are_refused_by_name(model_and_splits, analysis):
    model, splits = model_and_splits
    floats = {name: dataclasses.replace(split, tokens=split.tokens.float()) for name, split in splits.items()}
    with pytest.raises(UserError, match=r"tokens have dtype torch.float32; expected integer ids"):
        ANALYSES[analysis](model, floats)


@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_meta_tensors_and_a_meta_model_are_refused(model_and_splits, analysis):
    model, splits = model_and_splits
    meta = {name: dataclasses.replace(split, tokens=split.tokens.to("meta")) for name, split in splits.items()}
    with pytest.raises(UserError, match="tokens are on the meta device"):
        ANALYSES[analysis](model, meta)
    import copy

    with pytest.raises(UserError, match="the model is on the meta device"):
        ANALYSES[analysis](copy.deepcopy(model).to("meta"), splits)


@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_a_model_of_another_task_is_refused(model_and_splits, analysis):
    _, parity = model_and_splits
    mod3_task = MPSPConfig.from_task("max_mod3_sum_mod3", seq_len=4, n_values=6, n_train=64, n_eval=32)
    mod3 = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_mlp=16, **mod3_task.model_dims()))
    with pytest.raises(UserError, match=r"task with 2 classes \(sum_parity\), but the model has 3 outputs"):
        ANALYSES[analysis](mod3, parity)


def test_fingerprints_of_constant_data_say_why_they_are_blank(model_and_splits):
    import math

    model, splits = model_and_splits
    tokens = splits["train"].tokens.clone()
    tokens[:, :-1] = 3  # every value the same: no correlation is defined
    constant = {**splits, "train": dataclasses.replace(splits["train"], tokens=tokens)}
    with pytest.warns(UserWarning, match=r"L0H0.qk_rho.* are NaN: a Spearman correlation is undefined where one "
                                         r"of its inputs is constant"):
        result = fingerprints(model, constant, n=16)
    assert all(math.isnan(row["qk_rho"]) for row in result.rows)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ordinary data: no such warning
        fingerprints(model, splits, n=16)
