"""Max-Parity-Sum-Parity (MPSP): a sum-mod-m label with a spurious shortcut.

Each example is a sequence of ``seq_len`` integers in ``0 .. n_values - 1`` followed by a
readout token (``n_values``). The label is ``sum(values) mod m`` (m = 2: sum parity,
m = 3: sum mod 3). The shortcut is ``max(values) mod m`` or ``values[0] mod m``.
The spurious ratio ``r`` of a split is the fraction of its examples whose shortcut equals
the label; ``make_split`` makes it exact: ``round(r * n)`` examples agree.

Splits used by every study (``make_splits``):

* ``train``: ``n_train`` examples at the configured ratio ``r``;
* ``val``: ``r = 1`` (shortcut-consistent; a shortcut model scores 100%);
* ``adv``: ``r = 0`` (adversarial; a shortcut model scores ~0% for m = 2).

Minimal pairs (``minimal_pairs``) for patching: each example of a split paired with a copy
that differs in one token, changed by the smallest step that moves the label while the
shortcut feature stays, so the pair flips agreement (shortcut-consistent <-> conflicting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from jaxtyping import Bool, Int

from interp_toolkit.config import Config, check_seed, reject_unknown_keys
from interp_toolkit.errors import UserError

if TYPE_CHECKING:  # torch is imported where splits are made: MPSPConfig (parsed by --help) needs none
    from torch import Tensor

LABELS = {"sum_parity": 2, "sum_mod3": 3}


class ModelDims(TypedDict):
    """The ``ModelConfig`` keywords a task fixes: ``ModelConfig(..., **task.model_dims())``."""

    d_vocab: int
    n_ctx: int
    d_vocab_out: int
SHORTCUTS = ("max", "first")
TASKS = {
    "max_parity_sum_parity": ("sum_parity", "max"),
    "first_parity_sum_parity": ("sum_parity", "first"),
    "max_mod3_sum_mod3": ("sum_mod3", "max"),
    "first_mod3_sum_mod3": ("sum_mod3", "first"),
}



def task_modulus(task: str) -> int:
    """m of a named task (``TASKS``): 2 for the parity tasks, 3 for the mod-3 tasks.

    Chance accuracy, and the spurious ratio at which the shortcut carries no signal, is 1/m.
    """
    if task not in TASKS:
        raise UserError(f"unknown MPSP task {task!r}; expected one of {sorted(TASKS)}")
    return LABELS[TASKS[task][0]]


# Fixed offsets so that train/val/adv never share a generator stream.
_SPLIT_SEED_OFFSETS = {"train": 0, "val": 1_000_003, "adv": 2_000_003, "extreme": 3_000_017}


@dataclass
class MPSPConfig(Config):
    """Validated description of an MPSP task and its standard splits.

    Defaults (see docs/tasks.md, "Defaults and why"): sum parity with the max-parity shortcut,
    sequences of 10 values in 0..9, 16,384 training examples, 2,048 per evaluation split.
    Length 10 (rather than 5) because at length 5 a 1-layer model learns the true rule at
    any r and a 2-layer model can memorize 4k examples (measured calibration runs; see docs/tasks.md).

    Attributes:
        label: ``"sum_parity"`` (m = 2) or ``"sum_mod3"`` (m = 3).
        shortcut: ``"max"`` (max element mod m) or ``"first"`` (first element mod m).
        seq_len: Number of values per example (>= 1).
        n_values: Values are drawn from ``0 .. n_values - 1`` (>= 1).
        r: Spurious ratio of the training split, in [0, 1].
        n_train: Training examples.
        n_eval: Examples in each of ``val`` and ``adv``.
        seed: Data seed; every split derives its own fixed seed from it.
        extreme_train: A departure from the paper for testing extrapolation (``None``: the
            split as sampled). When set, the training split holds exactly this many "extreme-count" sequences,
            those whose values all have residue m - 1 (all odd for the parity tasks; at an
            even length these are always anti-shortcut under the max shortcut), in place of
            as many sampled examples of the same agreement and label, so ``n_train``, r and the
            label balance stay exact. At length 8, values 0..9, a sampled split of 16,384
            holds ~9 such sequences, and models that learn the rule elsewhere can still miss
            exactly this group on the adversarial split.
    """

    label: str = "sum_parity"
    shortcut: str = "max"
    seq_len: int = 10
    n_values: int = 10
    r: float = 0.9
    n_train: int = 16_384
    n_eval: int = 2_048
    seed: int = 0
    extreme_train: int | None = None

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise UserError(f"MPSPConfig.label must be one of {sorted(LABELS)}, got {self.label!r}")
        if self.shortcut not in SHORTCUTS:
            raise UserError(f"MPSPConfig.shortcut must be one of {SHORTCUTS}, got {self.shortcut!r}")
        for name in ("seq_len", "n_values", "n_train", "n_eval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"MPSPConfig.{name} must be a positive integer, got {value!r}")
        _check_ratio(self.r)
        check_seed("MPSPConfig.seed", self.seed, "the data seed")
        if self.extreme_train is not None and (
                isinstance(self.extreme_train, bool) or not isinstance(self.extreme_train, int)
                or not 0 <= self.extreme_train <= self.n_train):
            raise UserError(f"MPSPConfig.extreme_train must be an integer in [0, n_train={self.n_train}], "
                             f"got {self.extreme_train!r}")
        if self.extreme_train is not None and self.n_values < self.modulus:
            raise UserError(f"MPSPConfig.extreme_train needs a value with residue {self.modulus - 1} mod "
                             f"{self.modulus}; n_values={self.n_values} has none")

    def to_dict(self) -> dict[str, Any]:
        """Every field, except ``extreme_train`` when None: it was added after run keys (which hash
        this dict) were first issued, and runs made before it keep their keys."""
        data = super().to_dict()
        if data["extreme_train"] is None:
            del data["extreme_train"]
        return data

    @property
    def modulus(self) -> int:
        """m: the label is the sum mod m."""
        return LABELS[self.label]

    @property
    def readout_token(self) -> int:
        """Token appended after the values; the model predicts the label there."""
        return self.n_values

    @property
    def d_vocab(self) -> int:
        return self.n_values + 1

    @property
    def n_ctx(self) -> int:
        return self.seq_len + 1

    @property
    def name(self) -> str:
        """Task name, e.g. ``max_parity_sum_parity``."""
        for name, pair in TASKS.items():
            if pair == (self.label, self.shortcut):
                return name
        raise AssertionError("unreachable")

    @classmethod
    def from_task(cls, task: str, **kwargs: Any) -> "MPSPConfig":
        """Config for a named task (one of ``TASKS``) with other fields as keywords."""
        if task not in TASKS:
            raise UserError(f"unknown MPSP task {task!r}; expected one of {sorted(TASKS)}")
        label, shortcut = TASKS[task]
        reject_unknown_keys(cls, kwargs)  # a misspelled field is named, not a TypeError
        return cls(label=label, shortcut=shortcut, **kwargs)

    def model_dims(self) -> ModelDims:
        """Vocabulary/context sizes a model for this task needs (``ModelConfig`` keywords)."""
        return {"d_vocab": self.d_vocab, "n_ctx": self.n_ctx, "d_vocab_out": self.modulus}




@dataclass
class MPSPSplit:
    """One split of an MPSP task.

    Attributes:
        values: The integer sequences, ``[n, seq_len]``.
        tokens: Model input: values then the readout token, ``[n, seq_len + 1]``.
        labels: ``sum(values) mod m``, ``[n]``.
        shortcut: The shortcut feature (max or first element mod m), ``[n]``.
        agrees: ``shortcut == labels``, ``[n]``.
        r: The exact fraction of agreeing examples.
        task: The task that made the split (``make_split`` sets it; needed by
            :func:`minimal_pairs`), or ``None``.
    """

    values: Int[Tensor, "n seq"]
    tokens: Int[Tensor, "n pos"]
    labels: Int[Tensor, " n"]
    shortcut: Int[Tensor, " n"]
    agrees: Bool[Tensor, " n"]
    r: float
    task: MPSPConfig | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, index: Tensor) -> "MPSPSplit":
        """The examples selected by a boolean mask or index tensor."""
        agrees = self.agrees[index]
        r = float(agrees.float().mean()) if agrees.numel() else 0.0
        return MPSPSplit(self.values[index], self.tokens[index], self.labels[index],
                         self.shortcut[index], agrees, r, self.task)


def _check_ratio(r: float) -> None:
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0.0 <= float(r) <= 1.0):
        raise UserError(f"spurious ratio r must be a number in [0, 1], got {r!r}")


def compute_features(
    values: Int[Tensor, "n seq"], label: str, shortcut: str
) -> tuple[Int[Tensor, " n"], Int[Tensor, " n"]]:
    """Label and shortcut of each sequence."""
    m = LABELS[label]
    labels = values.sum(dim=-1) % m
    feature = values.max(dim=-1).values if shortcut == "max" else values[:, 0]
    return labels, feature % m


def example_features(values: Int[Tensor, "n seq"], task: MPSPConfig) -> dict[str, Int[Tensor, " n"]]:
    """Task-meaningful features of each sequence, to group examples by (e.g. which ones a
    model gets wrong: :mod:`interp_toolkit.analyses.near_misses`).

    Every task variant gets, in this order:

    * the count of values with each residue mod m: ``n_odd`` for the parity tasks (the count
      of even values is ``seq_len - n_odd``), ``n_mod3_0``, ``n_mod3_1``, ``n_mod3_2`` for the
      mod-3 tasks;
    * ``label``: the sum mod m (the label is the sum mod m, so this is also "sum mod m");
    * ``shortcut``: the shortcut feature (max or first value mod m);
    * ``max``: the max value, and ``max_count``: how many values equal it;
    * ``max_position`` (max-shortcut tasks: the first position holding the max) or
      ``first_value`` (first-element tasks: the value the shortcut reads).

    Args:
        values: The sequences (``MPSPSplit.values``).
        task: The task that made them (its modulus and shortcut kind).

    Returns:
        Feature name -> one integer per sequence, ``[n]``.

    Raises:
        ValueError: ``values`` is not a 2-D integer tensor of ``task.seq_len`` columns.
    """
    import torch

    if not isinstance(values, torch.Tensor) or values.ndim != 2 or values.dtype.is_floating_point \
            or values.shape[1] != task.seq_len:
        raise UserError(f"values must be an integer tensor [n, {task.seq_len}] (seq_len of the task), got "
                         f"{type(values).__name__} {tuple(getattr(values, 'shape', ()))}")
    m = task.modulus
    residues = values % m
    features: dict[str, Tensor] = {}
    if m == 2:
        features["n_odd"] = (residues == 1).sum(-1)
    else:
        for c in range(m):
            features[f"n_mod{m}_{c}"] = (residues == c).sum(-1)
    labels, shortcut = compute_features(values, task.label, task.shortcut)
    features["label"] = labels
    features["shortcut"] = shortcut
    top = values.max(dim=-1).values
    at_max = values == top[:, None]
    features["max"] = top
    features["max_count"] = at_max.sum(-1)
    if task.shortcut == "max":
        # argmax of a 0/1 row is its first 1 (torch returns the first maximal index)
        features["max_position"] = at_max.to(torch.uint8).argmax(-1)
    else:
        features["first_value"] = values[:, 0]
    return {name: feature.long() for name, feature in features.items()}


def _group_counts(n: int, r: float, feasible: dict[tuple[bool, int], bool], m: int,
                  cfg_desc: str) -> dict[tuple[bool, int], int]:
    n_agree = int(round(r * n))
    counts: dict[tuple[bool, int], int] = {}
    for agree, size in ((True, n_agree), (False, n - n_agree)):
        labels = [c for c in range(m) if feasible[(agree, c)]]
        if size and not labels:
            kind = "agree with" if agree else "disagree with"
            raise UserError(
                f"{cfg_desc} cannot produce examples whose shortcut {kind} the label "
                f"(needed {size}); increase seq_len or n_values, or use r="
                f"{'0' if agree else '1'}"
            )
        base, extra = divmod(size, max(len(labels), 1))
        for i, c in enumerate(labels):
            counts[(agree, c)] = base + (1 if i < extra else 0)
    return counts


def make_split(cfg: MPSPConfig, r: float, n: int, seed: int) -> MPSPSplit:
    """Sample ``n`` examples of the task in ``cfg`` with exactly ``round(r * n)`` agreeing.

    Within the agreeing and the disagreeing groups, labels are balanced as evenly as the
    task allows (a label that cannot occur in a group is left out of it).

    Args:
        cfg: Task (label, shortcut, seq_len, n_values); its ``r``/``n_train``/``seed`` are
            not used here.
        r: Fraction of examples whose shortcut equals the label, in [0, 1]. Values below
            1/m are the anti-shortcut regime.
        n: Number of examples (>= 1).
        seed: Seed of this split's generator: same seed, same data.

    Raises:
        ValueError: r outside [0, 1], n < 1, or a task that cannot produce a needed group.
    """
    import torch

    _check_ratio(r)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"number of examples n must be a positive integer, got {n!r}")
    m = cfg.modulus
    gen = torch.Generator().manual_seed(int(seed))
    desc = f"MPSP task (label={cfg.label}, shortcut={cfg.shortcut}, seq_len={cfg.seq_len}, n_values={cfg.n_values})"

    def sample(k: int) -> Tensor:
        return torch.randint(0, cfg.n_values, (k, cfg.seq_len), generator=gen)

    # A pilot sample tells which (agree, label) cells the task can produce at all.
    pilot = sample(max(65_536, 4 * n))
    labels, feature = compute_features(pilot, cfg.label, cfg.shortcut)
    agree = feature == labels
    feasible = {(a, c): bool(((agree == a) & (labels == c)).any()) for a in (True, False) for c in range(m)}
    need = _group_counts(n, float(r), feasible, m, desc)

    chosen: dict[tuple[bool, int], list[Tensor]] = {key: [] for key in need}
    have = dict.fromkeys(need, 0)
    batch = pilot
    for _attempt in range(10_000):
        labels, feature = compute_features(batch, cfg.label, cfg.shortcut)
        agree = feature == labels
        for key, want in need.items():
            if have[key] >= want:
                continue
            rows = batch[(agree == key[0]) & (labels == key[1])][: want - have[key]]
            chosen[key].append(rows)
            have[key] += rows.shape[0]
        if all(have[k] >= need[k] for k in need):
            break
        batch = sample(max(65_536, 4 * n))
    else:  # pragma: no cover - only for pathologically rare cells
        raise UserError(f"{desc}: could not sample enough examples for groups {need}")

    values = torch.cat([torch.cat(v) if v else torch.empty(0, cfg.seq_len, dtype=torch.long)
                        for v in chosen.values()])
    values = values[torch.randperm(values.shape[0], generator=gen)]
    labels, feature = compute_features(values, cfg.label, cfg.shortcut)
    readout = torch.full((n, 1), cfg.readout_token, dtype=torch.long)
    tokens = torch.cat([values, readout], dim=1)
    agrees = feature == labels
    return MPSPSplit(values, tokens, labels, feature, agrees, float(agrees.float().mean()), cfg)


#: Bytes per sampled token while a split is built: int64 values, a pilot sample of 4x the
#: split, and the features and masks computed on it (a bound, not a measurement).
_BYTES_PER_SPLIT_TOKEN = 8 * 4 * 3


def check_data_size(cfg: MPSPConfig, free: int | None = None) -> None:
    """Refuse, before any sampling, splits whose construction cannot fit in memory (as
    :func:`interp_toolkit.model.check_model_size` refuses a model): the three splits'
    tokens with the sampler's working copies, against the host's available memory.

    Args:
        cfg: The task.
        free: Bytes available (default: read from the host).

    Raises:
        UserError: Naming n_train, n_eval and seq_len, the bytes needed and available.
    """
    from interp_toolkit.model import available_memory

    free = available_memory("cpu") if free is None else free
    tokens = (cfg.n_train + 2 * cfg.n_eval) * cfg.seq_len
    needed = tokens * _BYTES_PER_SPLIT_TOKEN
    if free is not None and needed > free:
        raise UserError(f"the task's splits (n_train {cfg.n_train:,}, n_eval {cfg.n_eval:,} x 2, seq_len "
                        f"{cfg.seq_len}) need ~{needed / 2**30:,.1f} GiB to build, more than the "
                        f"{free / 2**30:.1f} GiB available; choose a smaller --task.n-train / --task.n-eval")


def make_splits(cfg: MPSPConfig) -> dict[str, MPSPSplit]:
    """The standard splits: ``train`` (at ``cfg.r``), ``val`` (r = 1) and ``adv`` (r = 0).

    Each split has its own fixed seed derived from ``cfg.seed``.

    Raises:
        UserError: If building them cannot fit in memory (:func:`check_data_size`).
    """
    check_data_size(cfg)
    train = make_split(cfg, cfg.r, cfg.n_train, cfg.seed + _SPLIT_SEED_OFFSETS["train"])
    if cfg.extreme_train is not None:
        train = with_extreme_count(train, cfg, cfg.extreme_train, cfg.seed + _SPLIT_SEED_OFFSETS["extreme"])
    return {
        "train": train,
        "val": make_split(cfg, 1.0, cfg.n_eval, cfg.seed + _SPLIT_SEED_OFFSETS["val"]),
        "adv": make_split(cfg, 0.0, cfg.n_eval, cfg.seed + _SPLIT_SEED_OFFSETS["adv"]),
    }


def is_extreme_count(values: Int[Tensor, "n seq"], m: int) -> Bool[Tensor, " n"]:
    """Whether every value of a sequence has residue m - 1 (all odd, for m = 2)."""
    return ((values % m) == m - 1).all(dim=-1)


def with_extreme_count(split: MPSPSplit, cfg: MPSPConfig, k: int, seed: int) -> MPSPSplit:
    """``split`` holding exactly ``k`` extreme-count sequences (:func:`is_extreme_count`).

    Extreme-count sequences all share one label and one shortcut value, so they are swapped in
    for (or out against) examples of that same label and agreement: the split's size, its
    ratio r and its label balance are unchanged. New sequences draw each value uniformly from
    the values with residue m - 1; removed ones are replaced by fresh non-extreme sequences of
    the same label and agreement. Positions of the swapped examples are chosen at random
    (``seed``); every other example keeps its place.

    Raises:
        ValueError: ``k`` outside [0, len(split)], or the split has too few examples of the
            extreme group's label and agreement to swap.
    """
    import torch

    n = len(split)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise UserError(f"number of extreme-count sequences must be an integer in [0, {n}], got {k!r}")
    m = cfg.modulus
    gen = torch.Generator().manual_seed(int(seed))
    extreme_values = torch.arange(m - 1, cfg.n_values, m)
    probe = extreme_values[torch.randint(0, len(extreme_values), (1, cfg.seq_len), generator=gen)]
    label, feature = compute_features(probe, cfg.label, cfg.shortcut)
    same_cell = (split.labels == label) & (split.agrees == (feature == label))
    extreme = is_extreme_count(split.values, m)
    values = split.values.clone()
    have = int(extreme.sum())
    if k > have:
        candidates = (same_cell & ~extreme).nonzero().flatten()
        if len(candidates) < k - have:
            raise UserError(f"the split has {len(candidates)} examples of label {int(label)} and agreement "
                             f"{bool(feature == label)} to swap for extreme-count sequences; {k - have} needed")
        picked = candidates[torch.randperm(len(candidates), generator=gen)[: k - have]]
        values[picked] = extreme_values[torch.randint(0, len(extreme_values), (len(picked), cfg.seq_len),
                                                      generator=gen)]
    elif k < have:
        extra = extreme.nonzero().flatten()
        picked = extra[torch.randperm(len(extra), generator=gen)[: have - k]]
        fresh: list[Tensor] = []
        while sum(len(f) for f in fresh) < len(picked):
            batch = torch.randint(0, cfg.n_values, (4 * len(picked) + 64, cfg.seq_len), generator=gen)
            b_labels, b_feature = compute_features(batch, cfg.label, cfg.shortcut)
            keep = (b_labels == label) & ((b_feature == b_labels) == (feature == label)) & ~is_extreme_count(batch, m)
            fresh.append(batch[keep])
        values[picked] = torch.cat(fresh)[: len(picked)]
    labels, shortcut = compute_features(values, cfg.label, cfg.shortcut)
    readout = torch.full((n, 1), cfg.readout_token, dtype=torch.long)
    agrees = shortcut == labels
    return MPSPSplit(values, torch.cat([values, readout], dim=1), labels, shortcut, agrees,
                     float(agrees.float().mean()), cfg)


@dataclass
class MinimalPairs:
    """Pairs of examples that differ in one token and flip agreement with the shortcut.

    Attributes:
        source: The original examples (a subset of the split they came from).
        target: Each source example with one value changed: the label moved, the shortcut
            feature (the max value, or the first element) kept, so ``target.agrees`` is
            ``~source.agrees``.
        position: The changed position of each pair, ``[n]``.
        delta: ``target value - source value`` at that position, ``[n]``.
        index: Index of each source example in the split it came from, ``[n]``.
    """

    source: MPSPSplit
    target: MPSPSplit
    position: Int[Tensor, " n"]
    delta: Int[Tensor, " n"]
    index: Int[Tensor, " n"]

    def __len__(self) -> int:
        return len(self.source)

    def head(self, n: int) -> "MinimalPairs":
        """The first ``n`` pairs."""
        import torch

        keep = torch.arange(min(n, len(self)))
        return MinimalPairs(self.source.subset(keep), self.target.subset(keep), self.position[keep],
                            self.delta[keep], self.index[keep])

    def swapped(self) -> "MinimalPairs":
        """The reverse direction: target becomes source (same pairs)."""
        return MinimalPairs(self.target, self.source, self.position, -self.delta, self.index)


def _minimal_edit(values: list[int], label: int, shortcut_kind: str, m: int, n_values: int,
                  want_agree: bool, order: list[int], sign_first: int) -> tuple[int, int] | None:
    """(position, delta) of the smallest valid edit of one sequence, or None."""
    top = max(values)
    feature = (top if shortcut_kind == "max" else values[0]) % m
    total = sum(values)
    for step in range(1, n_values):
        for delta in (sign_first * step, -sign_first * step):
            new_label = (total + delta) % m
            if new_label == label or (new_label == feature) != want_agree:
                continue
            for pos in order:
                new = values[pos] + delta
                if not 0 <= new < n_values:
                    continue
                if shortcut_kind == "first":
                    if pos == 0:
                        continue
                elif new > top or (values[pos] == top and values.count(top) == 1):
                    # the max shortcut: the changed element stays at or below the max, and the
                    # max value itself is unchanged (a lone max is never lowered)
                    continue
                return pos, delta
    return None


def minimal_pairs(split: MPSPSplit, n: int | None = None, seed: int = 0) -> MinimalPairs:
    """Minimal pairs built from the examples of ``split`` (see :class:`MinimalPairs`).

    For each example (in order, until ``n`` pairs), one value other than the shortcut
    element is changed by the smallest step (|delta| = 1 first, then 2, ...) that changes
    the label (sum mod m) so that agreement with the shortcut flips, while the shortcut
    feature keeps its value: for the max shortcut the changed element stays at or below
    the max and the max value is unchanged; for the first-element shortcut position 0 is
    never changed. Ties between positions and between +step and -step are broken at random
    (``seed``). Examples without such an edit (e.g. all values 0 under the max shortcut)
    are skipped.

    Args:
        split: A split made by :func:`make_split` (it records its task).
        n: Number of pairs (``None``: one per example that has an edit).
        seed: Seed of the tie-breaking generator.

    Raises:
        ValueError: a split without its task, or ``n`` larger than the pairs available.
    """
    import torch

    if not isinstance(split, MPSPSplit) or split.task is None:
        raise UserError("minimal_pairs needs an MPSPSplit made by make_split (it records its task); "
                         f"got {type(split).__name__} without one")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise UserError(f"number of pairs n must be a positive integer or None, got {n!r}")
    cfg = split.task
    m = cfg.modulus
    gen = torch.Generator().manual_seed(int(seed))
    seq_len = split.values.shape[1]
    chosen, positions, deltas = [], [], []
    rows = split.values.tolist()
    labels = split.labels.tolist()
    agrees = split.agrees.tolist()
    for i, values in enumerate(rows):
        order = torch.randperm(seq_len, generator=gen).tolist()
        sign_first = 1 if torch.rand((), generator=gen) < 0.5 else -1
        edit = _minimal_edit(values, labels[i], cfg.shortcut, m, cfg.n_values, not agrees[i], order, sign_first)
        if edit is None:
            continue
        chosen.append(i)
        positions.append(edit[0])
        deltas.append(edit[1])
        if n is not None and len(chosen) == n:
            break
    if n is not None and len(chosen) < n:
        raise UserError(f"split has only {len(chosen)} examples with a minimal edit, asked for n={n}")
    if not chosen:
        raise UserError("no example of the split has a minimal edit (e.g. every value is 0)")
    index = torch.tensor(chosen, dtype=torch.long)
    source = split.subset(index)
    position = torch.tensor(positions, dtype=torch.long)
    delta = torch.tensor(deltas, dtype=torch.long)
    values = source.values.clone()
    values[torch.arange(len(chosen)), position] += delta
    labels_t, feature = compute_features(values, cfg.label, cfg.shortcut)
    tokens = torch.cat([values, source.tokens[:, seq_len:]], dim=1)
    agrees_t = feature == labels_t
    target = MPSPSplit(values, tokens, labels_t, feature, agrees_t, float(agrees_t.float().mean()), cfg)
    return MinimalPairs(source, target, position, delta, index)


__all__ = ["LABELS", "SHORTCUTS", "TASKS", "MPSPConfig", "MPSPSplit", "MinimalPairs", "ModelDims", "compute_features",
           "example_features", "is_extreme_count",
           "make_split", "make_splits", "minimal_pairs", "task_modulus", "with_extreme_count"]
