"""Command-line flags generated from configs: one nested style, short spellings where unambiguous."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from interp_toolkit.config import Config, parse_config, section_short_flags


@dataclass
class _Inner(Config):
    eps: float = 1e-3
    seed: int = 0
    keep: bool = False


@dataclass
class _Other(Config):
    seed: int = 1
    width: int = 8


@dataclass
class _Command(Config):
    width: int = 4
    sampler: _Inner = field(default_factory=_Inner)
    model: _Other = field(default_factory=_Other)


def test_a_section_field_is_nested_and_its_own_name_where_unambiguous():
    shorts = section_short_flags(_Command)
    assert shorts == {"--eps": "--sampler.eps", "--keep": "--sampler.keep", "--no-keep": "--sampler.no-keep"}
    # seed is in two sections, width is also a top-level flag: neither gets a short spelling
    nested = parse_config(_Command, ["--sampler.eps", "0.5", "--model.seed", "3", "--sampler.keep", "--width", "9"])
    short = parse_config(_Command, ["--eps=0.5", "--model.seed", "3", "--keep", "--width", "9"])
    assert nested == short
    assert (short.sampler.eps, short.model.seed, short.sampler.keep, short.width, short.model.width) == (
        0.5, 3, True, 9, 8,
    )
    assert parse_config(_Command, ["--keep", "--no-keep"]).sampler.keep is False


def test_a_bad_short_flag_is_named_as_typed(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_config(_Command, ["--eps", "lots"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("error:") == 1 and "--eps" in err and "lots" in err


def test_an_ambiguous_name_is_refused_not_guessed(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_config(_Command, ["--seed", "3"])
    assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err
