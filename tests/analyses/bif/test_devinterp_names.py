"""``SamplerConfig.from_devinterp``: devinterp's setting names give the same sampler as this
toolkit's (README: "Coming from TransformerLens 3 / devinterp")."""

from __future__ import annotations

import pytest
import torch

from interp_toolkit.analyses.bif import SamplerConfig
from interp_toolkit.analyses.bif.config import DEVINTERP_NAMES
from interp_toolkit.errors import UserError
from tests.analyses.bif.test_bif import _record_draws

OWN = dict(eps=0.02, gamma=5.0, n_beta=10.0, chains=3, draws=40, burn_in=20, steps_between_draws=2, batch_size=4,
           seed=7, progress=False)
DEVINTERP = dict(lr=0.02, localization=5.0, nbeta=10.0, num_chains=3, num_draws=40, num_burnin_steps=20,
                 num_steps_bw_draws=2, batch_size=4, init_seed=7, progress=False)


def test_devinterp_names_give_the_same_config_and_draws():
    own = SamplerConfig(**OWN)
    assert SamplerConfig.from_devinterp(**DEVINTERP) == own
    # the SGLD optimizer's keywords as devinterp's sample() takes them, n_beta spelled both ways
    kwargs = {k: v for k, v in DEVINTERP.items() if k not in ("lr", "localization", "nbeta")}
    assert SamplerConfig.from_devinterp(optimizer_kwargs={"lr": 0.02, "localization": 5.0, "n_beta": 10.0},
                                        **kwargs) == own
    assert torch.equal(_record_draws(SamplerConfig.from_devinterp(**DEVINTERP)), _record_draws(own))


def test_every_devinterp_name_maps_to_a_field_and_others_keep_their_defaults():
    fields = set(SamplerConfig.__dataclass_fields__)
    assert set(DEVINTERP_NAMES.values()) <= fields
    config = SamplerConfig.from_devinterp(lr=0.5)
    assert config == SamplerConfig(eps=0.5)


def test_unknown_and_conflicting_names_are_refused():
    with pytest.raises(UserError, match=r"unknown setting\(s\) \['num_burnin'\]"):
        SamplerConfig.from_devinterp(num_burnin=10)
    with pytest.raises(UserError, match="eps twice with different values: lr=0.1 and eps=0.2"):
        SamplerConfig.from_devinterp(lr=0.1, eps=0.2)
    with pytest.raises(UserError, match="n_beta twice"):
        SamplerConfig.from_devinterp(optimizer_kwargs={"nbeta": 3.0}, n_beta=4.0)
    # the same value under both names is one setting
    assert SamplerConfig.from_devinterp(num_chains=2, chains=2).chains == 2
    with pytest.raises(UserError, match="SamplerConfig.eps must be a finite number > 0"):
        SamplerConfig.from_devinterp(lr=-1.0)
