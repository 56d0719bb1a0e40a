"""Synthetic language-model corpus with induction patterns and nested delimiters.

Every sequence starts with ``BOS`` and mixes three ingredients over a small vocabulary:

* ordinary tokens drawn uniformly at random (unpredictable);
* one random *chunk* of ordinary tokens that appears twice: after its first token, the
  second copy is predictable by an induction head (match the previous occurrence, copy the
  token that followed it);
* nested delimiter pairs (``n_delimiter_types`` bracket types, depth <= ``max_depth``): an
  opening delimiter's type is random, a closing delimiter must match the innermost open one
  (predictable from the stack; its timing is random).

Vocabulary layout: ``0`` = BOS; ``1 + 2k`` / ``2 + 2k`` = open / close delimiter of type
``k``; the rest are ordinary tokens. Every position gets a token-class label
(:data:`CLASS_NAMES`); the label of the *target* token classifies a next-token loss, see
:func:`target_classes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

__all__ = [
    "CLASS_NAMES",
    "CorpusConfig",
    "InductionCorpus",
    "make_corpus",
    "repeated_random_tokens",
    "target_classes",
]

#: Token classes, by label id.
CLASS_NAMES: tuple[str, ...] = ("bos", "random", "induction", "open", "close")
BOS, RANDOM, INDUCTION, OPEN, CLOSE = range(len(CLASS_NAMES))


@dataclass
class CorpusConfig(Config):
    """Validated corpus settings.

    Attributes:
        n_sequences: Number of sequences (>= 1).
        seq_len: Tokens per sequence including BOS (>= 2 * chunk_max + 2).
        n_ordinary: Ordinary (non-special) tokens (>= 2).
        n_delimiter_types: Bracket types (>= 1).
        max_depth: Maximum nesting depth of delimiters (>= 1).
        p_open: Probability that a free position opens a delimiter (if depth allows).
        p_close: Probability that a free position closes the innermost open delimiter.
        chunk_min, chunk_max: Length range of the repeated chunk (2 <= min <= max).
        seed: Generator seed (same seed, same corpus).
    """

    n_sequences: int = 2048
    seq_len: int = 48
    n_ordinary: int = 48
    n_delimiter_types: int = 3
    max_depth: int = 3
    p_open: float = 0.12
    p_close: float = 0.15
    chunk_min: int = 5
    chunk_max: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for name, minimum in (("n_sequences", 1), ("n_ordinary", 2), ("n_delimiter_types", 1), ("max_depth", 1),
                              ("chunk_min", 2), ("chunk_max", 2), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UserError(f"CorpusConfig.{name} must be an integer >= {minimum}, got {value!r}")
        if self.chunk_max < self.chunk_min:
            raise UserError(f"CorpusConfig.chunk_max ({self.chunk_max}) must be >= chunk_min ({self.chunk_min})")
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2 * self.chunk_max + 2:
            raise UserError(
                f"CorpusConfig.seq_len must be an integer >= 2 * chunk_max + 2 = {2 * self.chunk_max + 2}, "
                f"got {self.seq_len!r}"
            )
        for name in ("p_open", "p_close"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
                raise UserError(f"CorpusConfig.{name} must be a probability in [0, 1], got {value!r}")
        if self.p_open + self.p_close > 1.0:
            raise UserError(f"CorpusConfig.p_open + p_close must be <= 1, got {self.p_open + self.p_close}")

    @property
    def vocab_size(self) -> int:
        """BOS + 2 delimiters per type + ordinary tokens."""
        return 1 + 2 * self.n_delimiter_types + self.n_ordinary

    @property
    def first_ordinary(self) -> int:
        """Id of the first ordinary token."""
        return 1 + 2 * self.n_delimiter_types




@dataclass
class InductionCorpus:
    """Token sequences with a class label per position.

    Attributes:
        tokens: Token ids, ``[n_sequences, seq_len]``.
        classes: Class id (index into :data:`CLASS_NAMES`) of every token.
        config: The generating config.
    """

    tokens: Int[Tensor, "n seq"]
    classes: Int[Tensor, "n seq"]
    config: CorpusConfig

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def subset(self, index: slice | Tensor) -> "InductionCorpus":
        """Rows ``index`` as a new corpus (same config)."""
        return InductionCorpus(self.tokens[index], self.classes[index], self.config)


def make_corpus(config: CorpusConfig) -> InductionCorpus:
    """Generate the corpus described by ``config`` (deterministic in ``config.seed``).

    Args:
        config: Corpus settings.

    Returns:
        Tokens and per-position class labels.
    """
    gen = torch.Generator().manual_seed(config.seed)
    n, length = config.n_sequences, config.seq_len
    tokens = torch.zeros(n, length, dtype=torch.long)
    classes = torch.full((n, length), RANDOM, dtype=torch.long)
    classes[:, 0] = BOS

    def uniform() -> float:
        return float(torch.rand((), generator=gen))

    def randint(low: int, high: int) -> int:  # inclusive low, exclusive high
        return int(torch.randint(low, high, (), generator=gen))

    for row in range(n):
        chunk_len = randint(config.chunk_min, config.chunk_max + 1)
        chunk = torch.randint(config.first_ordinary, config.vocab_size, (chunk_len,), generator=gen)
        # Chunk copies at [p1, p1 + L) and [p2, p2 + L) with p2 >= p1 + L, inside 1..length-1.
        p1 = randint(1, length - 2 * chunk_len + 1)
        p2 = randint(p1 + chunk_len, length - chunk_len + 1)
        stack: list[int] = []
        for pos in range(1, length):
            if p1 <= pos < p1 + chunk_len or p2 <= pos < p2 + chunk_len:
                offset = pos - (p1 if pos < p1 + chunk_len else p2)
                tokens[row, pos] = chunk[offset]
                if pos >= p2 + 1:
                    classes[row, pos] = INDUCTION
                continue
            u = uniform()
            if u < config.p_open and len(stack) < config.max_depth:
                kind = randint(0, config.n_delimiter_types)
                stack.append(kind)
                tokens[row, pos] = 1 + 2 * kind
                classes[row, pos] = OPEN
            elif u < config.p_open + config.p_close and stack:
                kind = stack.pop()
                tokens[row, pos] = 2 + 2 * kind
                classes[row, pos] = CLOSE
            else:
                tokens[row, pos] = randint(config.first_ordinary, config.vocab_size)
    return InductionCorpus(tokens, classes, config)


def target_classes(classes: Int[Tensor, "n seq"]) -> Int[Tensor, "n seq_minus_1"]:
    """Class of each next-token loss: the loss at position ``t`` predicts token ``t + 1``."""
    return classes[:, 1:]


def repeated_random_tokens(
    n: int, half_len: int, vocab_low: int, vocab_high: int, seed: int = 0, bos: int | None = 0
) -> Int[Tensor, "n seq"]:
    """``[BOS] + r + r`` with ``r`` uniform random tokens in ``[vocab_low, vocab_high)``.

    The standard probe for induction heads (prefix matching on a repeated random sequence).

    Args:
        n: Sequences.
        half_len: Length of ``r``.
        vocab_low, vocab_high: Token range of ``r``.
        seed: Generator seed.
        bos: BOS id prepended, or ``None`` for none.
    """
    if n < 1 or half_len < 2 or vocab_high - vocab_low < 2:
        raise UserError(f"need n >= 1, half_len >= 2 and >= 2 tokens, got {n}, {half_len}, [{vocab_low}, {vocab_high})")
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(vocab_low, vocab_high, (n, half_len), generator=gen)
    parts = [r, r] if bos is None else [torch.full((n, 1), bos, dtype=torch.long), r, r]
    return torch.cat(parts, dim=1)
