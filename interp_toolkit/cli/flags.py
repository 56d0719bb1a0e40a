"""The short flags users type most, one table for every command that takes run settings.

Every command's flags are generated from its configs, nested as tyro spells them
(``--task.seq-len``, ``--model.d-model``, ``--train.lr``). The settings people type most also
have a short spelling, the same in ``train`` and ``sweep``: :data:`SHORT_FLAGS`, built from the
flat names a sweep's config files accept (:data:`~interp_toolkit.studies.grid.config.FLAT_NAMES`),
so a file key ``lr`` and a flag ``--lr`` always mean ``train.lr``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from interp_toolkit.studies.grid.config import FLAT_NAMES


def nested_flag(section: str, name: str) -> str:
    """``--SECTION.FIELD`` as the generated flags spell a config section's field."""
    return f"--{section}.{name.replace('_', '-')}"


#: short spelling -> the generated nested flag (``--lr`` -> ``--train.lr``)
SHORT_FLAGS: dict[str, str] = {f"--{flat.replace('_', '-')}": nested_flag(section, name)
                               for flat, (section, name) in FLAT_NAMES.items()}


def short_flags_text(aliases: Mapping[str, str | Sequence[str]]) -> str:
    """``--lr = --train.lr, ...`` for a command's description."""
    return ", ".join(f"{old} = {new if isinstance(new, str) else ' '.join(new)}" for old, new in aliases.items())


__all__ = ["SHORT_FLAGS", "nested_flag", "short_flags_text"]
