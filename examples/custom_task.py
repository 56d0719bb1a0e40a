"""A task of your own, end to end from the command line: "does the sequence contain a 0?"

The label is whether any value is 0; the shortcut is whether the first value is even (a
sequence that starts with 0 contains one, so the two agree more often than chance). The
spurious ratio ``r`` is the fraction of training examples where shortcut = label, as in
MPSP; ``val`` holds only agreeing examples and ``adv`` only conflicting ones, and each
split pairs its examples with a one-token edit that moves the label but keeps the first
value (``minimal_pairs``), so every command of the toolkit runs on this task::

    interp-toolkit train --task-factory examples/custom_task.py:make_splits \\
        --task-settings '{"r": 0.9, "n_train": 2048}' --train.epochs 40 --run-dir runs/zero
    interp-toolkit info runs/zero
    interp-toolkit analyze runs/zero --analysis patching
    interp-toolkit mechanism runs/zero
    interp-toolkit bif runs/zero/checkpoints/epoch_000040.safetensors

docs/custom_tasks.md walks through it; tests/examples/test_custom_task.py runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ZeroSplit:
    """One split: ``values`` [n, seq_len]; ``tokens`` the values then the readout token;
    ``labels`` (contains a 0); ``agrees`` (first value even == label)."""

    values: Tensor
    tokens: Tensor
    labels: Tensor
    agrees: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index: Tensor) -> "ZeroSplit":
        return ZeroSplit(self.values[index], self.tokens[index], self.labels[index], self.agrees[index])

    def minimal_pairs(self, seed: int = 0) -> "ZeroPairs":
        """Each example with one value changed (never the first) so that the label flips:
        a 0 put in a sequence without one, or the only 0 replaced by a non-zero value.
        Examples with several zeros have no such edit and are skipped."""
        gen = torch.Generator().manual_seed(seed)
        n, length = self.values.shape
        zeros = self.values == 0
        has_pair = ~self.labels.bool() | ((zeros.sum(1) == 1) & ~zeros[:, 0])
        keep = torch.nonzero(has_pair).flatten()
        target = self.values[keep].clone()
        n_values = int(self.tokens[0, -1])  # the readout token is n_values
        for row, example in enumerate(keep.tolist()):
            if self.labels[example]:  # replace the only zero
                position = int(torch.nonzero(zeros[example]).flatten()[0])
                target[row, position] = int(torch.randint(1, n_values, (1,), generator=gen))
            else:  # put a zero at a position after the first
                position = int(torch.randint(1, length, (1,), generator=gen))
                target[row, position] = 0
        return ZeroPairs(self.subset(keep), _split_of(target, n_values))

    @property
    def r(self) -> float:
        return float(self.agrees.float().mean())


@dataclass
class ZeroPairs:
    """Minimal pairs: ``target[i]`` is ``source[i]`` with one value changed."""

    source: ZeroSplit
    target: ZeroSplit

    def __len__(self) -> int:
        return len(self.source)

    def head(self, n: int) -> "ZeroPairs":
        keep = torch.arange(min(n, len(self)))
        return ZeroPairs(self.source.subset(keep), self.target.subset(keep))


def _split_of(values: Tensor, n_values: int) -> ZeroSplit:
    labels = (values == 0).any(1).long()
    shortcut = (values[:, 0] % 2 == 0).long()
    readout = torch.full((values.shape[0], 1), n_values, dtype=torch.long)
    return ZeroSplit(values, torch.cat([values, readout], 1), labels, shortcut == labels)


def make_split(r: float, n: int, seq_len: int, n_values: int, seed: int) -> ZeroSplit:
    """``n`` examples of which ``round(r * n)`` agree with the shortcut, drawn uniformly
    from each kind (rejection sampling)."""
    gen = torch.Generator().manual_seed(seed)
    n_agree = round(r * n)
    agreeing: list[Tensor] = []
    conflicting: list[Tensor] = []
    have = [0, 0]
    while have[0] < n_agree or have[1] < n - n_agree:
        batch = _split_of(torch.randint(0, n_values, (4 * n, seq_len), generator=gen), n_values)
        agreeing.append(batch.values[batch.agrees])
        conflicting.append(batch.values[~batch.agrees])
        have = [sum(len(v) for v in agreeing), sum(len(v) for v in conflicting)]
    values = torch.cat([torch.cat(agreeing)[:n_agree], torch.cat(conflicting)[: n - n_agree]])
    order = torch.randperm(n, generator=gen)
    return _split_of(values[order], n_values)


def make_splits(r: float = 0.9, seq_len: int = 6, n_values: int = 10, n_train: int = 2048, n_eval: int = 512,
                seed: int = 0) -> dict[str, ZeroSplit]:
    """The task factory: ``train`` at ratio ``r``, ``val`` (all agree) and ``adv`` (none do)."""
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"r must be in [0, 1], got {r!r}")
    if seq_len < 2 or n_values < 2:
        raise ValueError(f"seq_len and n_values must be at least 2, got {seq_len} and {n_values}")
    return {"train": make_split(r, n_train, seq_len, n_values, seed),
            "val": make_split(1.0, n_eval, seq_len, n_values, seed + 1),
            "adv": make_split(0.0, n_eval, seq_len, n_values, seed + 2)}
