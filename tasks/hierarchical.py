"""Hierarchical semantic data: items, properties at several levels of a tree, and the SVD
of the input-output correlation whose modes a deep linear network learns one stage at a
time (Rumelhart & Todd 1993; Saxe, McClelland & Ganguli 2019, PNAS).

Any tree can be built from a nested dict (:func:`hierarchy_from_dict`); the preset
:func:`animals_and_plants` splits animals into mammals (dog, cat) and birds (sparrow, robin).
The classic eight-item *living things* hierarchy (:func:`living_things`) is stated here
explicitly. Tree (depth 3)::

    living thing                      props: can_grow, is_living
    ├── animal                        props: can_move, has_skin
    │   ├── bird                      props: can_fly, has_feathers
    │   │   ├── canary                props: can_sing, is_yellow
    │   │   └── robin                 props: has_red_breast, eats_worms
    │   └── fish                      props: can_swim, has_gills
    │       ├── salmon                props: is_pink, swims_upstream
    │       └── sunfish               props: is_round, lives_in_ponds
    └── plant                         props: has_roots, needs_sunlight
        ├── tree                      props: has_bark, is_big
        │   ├── oak                   props: has_acorns, has_lobed_leaves
        │   └── pine                  props: has_needles, is_evergreen
        └── flower                    props: has_petals, is_pretty
            ├── rose                  props: has_thorns, is_red
            └── daisy                 props: is_white, has_yellow_centre

Every item has all properties of the nodes on its path from the root (2 per node, 30 in
all). Inputs are one-hot item vectors; targets are binary property vectors. Hierarchy
levels: 0 = root, 1 = kingdom (animal/plant), 2 = class (bird/fish/tree/flower),
3 = species (the item itself).

The SVD of the input-output correlation ``Sigma_yx = (1/P) sum_i y_i x_i^T`` gives modes
``(s_a, u_a, v_a)``; :func:`svd_modes` labels each mode with its hierarchy level: the
coarsest level whose group indicators span the mode's item vector ``v_a``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp_toolkit.errors import UserError

__all__ = [
    "ANIMALS_AND_PLANTS",
    "HierarchicalDataset",
    "SVDModes",
    "LIVING_THINGS_TREE",
    "animals_and_plants",
    "binary_tree_hierarchy",
    "hierarchy_from_dict",
    "living_things",
    "svd_modes",
]

# (node name, properties, children) -- the living-things hierarchy, stated once.
LIVING_THINGS_TREE = (
    "living thing", ("can_grow", "is_living"), (
        ("animal", ("can_move", "has_skin"), (
            ("bird", ("can_fly", "has_feathers"), (
                ("canary", ("can_sing", "is_yellow"), ()),
                ("robin", ("has_red_breast", "eats_worms"), ()),
            )),
            ("fish", ("can_swim", "has_gills"), (
                ("salmon", ("is_pink", "swims_upstream"), ()),
                ("sunfish", ("is_round", "lives_in_ponds"), ()),
            )),
        )),
        ("plant", ("has_roots", "needs_sunlight"), (
            ("tree", ("has_bark", "is_big"), (
                ("oak", ("has_acorns", "has_lobed_leaves"), ()),
                ("pine", ("has_needles", "is_evergreen"), ()),
            )),
            ("flower", ("has_petals", "is_pretty"), (
                ("rose", ("has_thorns", "is_red"), ()),
                ("daisy", ("is_white", "has_yellow_centre"), ()),
            )),
        )),
    ),
)  # fmt: skip


@dataclass
class HierarchicalDataset:
    """Items, properties and the tree that generated them.

    Attributes:
        items: Item names (leaves of the tree), in input order.
        properties: Property names, in target order.
        property_level: Tree depth of the node owning each property (0 = root).
        groups: ``groups[level]`` = list of item-index lists, one per node at that depth.
        group_names: Node names matching ``groups``.
        targets: ``[n_items, n_properties]`` property matrix (0/1, plus noise if any).
    """

    items: list[str]
    properties: list[str]
    property_level: list[int]
    groups: list[list[list[int]]]
    group_names: list[list[str]]
    targets: Float[Tensor, "items properties"]

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_properties(self) -> int:
        return len(self.properties)

    @property
    def depth(self) -> int:
        """Number of levels below the root (species level = ``depth``)."""
        return len(self.groups) - 1

    @property
    def inputs(self) -> Float[Tensor, "items items"]:
        """One-hot item inputs (identity matrix)."""
        return torch.eye(self.n_items)

    def item_index(self, name: str) -> int:
        return self.items.index(name)

    def lowest_common_level(self, i: int, j: int) -> int:
        """Depth of the deepest node containing both items ``i`` and ``j``."""
        level = 0
        for depth, nodes in enumerate(self.groups):
            if any(i in g and j in g for g in nodes):
                level = depth
        return level


def _from_tree(tree: tuple, noise: float = 0.0, seed: int = 0) -> HierarchicalDataset:
    items: list[str] = []
    properties: list[str] = []
    property_level: list[int] = []
    owners: list[list[int]] = []  # item indices owning each property
    groups: list[list[list[int]]] = []
    group_names: list[list[str]] = []

    def walk(node: tuple, depth: int) -> list[int]:
        name, props, children = node
        if children:
            members = [i for child in children for i in walk(child, depth + 1)]
        else:
            items.append(name)
            members = [len(items) - 1]
        while len(groups) <= depth:
            groups.append([])
            group_names.append([])
        groups[depth].append(members)
        group_names[depth].append(name)
        for prop in props:
            properties.append(prop)
            property_level.append(depth)
            owners.append(members)
        return members

    walk(tree, 0)
    targets = torch.zeros(len(items), len(properties))
    for p, members in enumerate(owners):
        targets[members, p] = 1.0
    if noise > 0:
        gen = torch.Generator().manual_seed(seed)
        targets = targets + noise * torch.randn(targets.shape, generator=gen)
    # Order nodes of every level by their first item so groups read left to right.
    for depth in range(len(groups)):
        level = groups[depth]
        order = sorted(range(len(level)), key=lambda k: min(level[k]))
        groups[depth] = [sorted(groups[depth][k]) for k in order]
        group_names[depth] = [group_names[depth][k] for k in order]
    return HierarchicalDataset(items, properties, property_level, groups, group_names, targets)


def living_things() -> HierarchicalDataset:
    """The eight-item living-things hierarchy (see the module docstring)."""
    return _from_tree(LIVING_THINGS_TREE)


# The paper's pairs (a dog sample on a sparrow sample) need mammals and birds under animals.
ANIMALS_AND_PLANTS: dict = {
    "animal": {"mammal": ["dog", "cat"], "bird": ["sparrow", "robin"]},
    "plant": {"tree": ["oak", "pine"], "flower": ["rose", "daisy"]},
}


def hierarchy_from_dict(
    tree: dict,
    root: str = "living thing",
    properties_per_node: int = 1,
    noise: float = 0.0,
    seed: int = 0,
) -> HierarchicalDataset:
    """Build a hierarchy from a nested dict whose leaves are lists of item names.

    Every node (the root, every dict key) and every item owns ``properties_per_node``
    properties, named ``"is_<node>"`` (``"is_<node>_<j>"`` for several), as in Saxe et al.;
    an item has the properties of every node on its path from the root. Subtrees may have
    different depths and sizes.

    Example::

        hierarchy_from_dict({"animal": {"mammal": ["dog", "cat"], "bird": ["sparrow", "robin"]},
                             "plant": ["oak", "rose"]})

    Args:
        tree: ``{node: subtree}``, a subtree being such a dict or a non-empty list of
            item names (strings). Node and item names must be unique.
        root: Name of the root node.
        properties_per_node: Properties owned by each node and item (>= 1).
        noise: Standard deviation of Gaussian noise added to the targets (>= 0).
        seed: Seed of the noise.

    Returns:
        The :class:`HierarchicalDataset` (items in the order they appear).

    Raises:
        ValueError: An empty subtree, a non-string name, a repeated name or a bad count.
    """
    if isinstance(properties_per_node, bool) or not isinstance(properties_per_node, int) or properties_per_node < 1:
        raise UserError(f"properties_per_node must be a positive integer, got {properties_per_node!r}")
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise UserError(f"noise must be a number >= 0, got {noise!r}")
    if not isinstance(tree, dict) or not tree:
        raise UserError(f"tree must be a non-empty dict of node -> subtree, got {tree!r}")
    seen: set[str] = set()

    def props(name: str) -> tuple[str, ...]:
        if properties_per_node == 1:
            return (f"is_{name}",)
        return tuple(f"is_{name}_{j}" for j in range(properties_per_node))

    def claim(name: object, where: str) -> str:
        if not isinstance(name, str) or not name:
            raise UserError(f"{where}: names must be non-empty strings, got {name!r}")
        if name in seen:
            raise UserError(f"{where}: name {name!r} appears twice; node and item names must be unique")
        seen.add(name)
        return name

    def node(name: str, subtree: object) -> tuple:
        claim(name, "hierarchy_from_dict")
        if isinstance(subtree, dict):
            if not subtree:
                raise UserError(f"node {name!r} has an empty dict of children")
            children = tuple(node(k, v) for k, v in subtree.items())
        elif isinstance(subtree, (list, tuple)):
            if not subtree:
                raise UserError(f"node {name!r} has an empty list of items")
            children = tuple((claim(item, f"items of {name!r}"), props(item), ()) for item in subtree)
        else:
            raise UserError(
                f"node {name!r}: a subtree must be a dict of children or a list of item names, "
                f"got {type(subtree).__name__}"
            )
        return (name, props(name), children)

    return _from_tree(node(root, tree), noise=noise, seed=seed)


def animals_and_plants() -> HierarchicalDataset:
    """Eight items: animals (mammals: dog, cat; birds: sparrow, robin) and plants (trees:
    oak, pine; flowers: rose, daisy), one property per node and item (15 properties).

    Built by :func:`hierarchy_from_dict` from :data:`ANIMALS_AND_PLANTS`. The paper's pair
    (a dog sample on a sparrow sample) shares the animal node and splits at mammal/bird.
    """
    return hierarchy_from_dict(ANIMALS_AND_PLANTS)


def binary_tree_hierarchy(
    depth: int = 3, properties_per_node: int = 1, noise: float = 0.0, seed: int = 0
) -> HierarchicalDataset:
    """A balanced binary tree with ``2**depth`` items and properties on every node.

    Args:
        depth: Levels below the root (>= 1).
        properties_per_node: Properties owned by every node (>= 1).
        noise: Standard deviation of Gaussian noise added to the targets (>= 0).
        seed: Seed of the noise.

    Returns:
        The dataset; node ``"n{depth}_{k}"`` owns properties ``"n{depth}_{k}_p{j}"``.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 12:
        raise UserError(f"depth must be an integer in [1, 12], got {depth!r}")
    if isinstance(properties_per_node, bool) or not isinstance(properties_per_node, int) or properties_per_node < 1:
        raise UserError(f"properties_per_node must be a positive integer, got {properties_per_node!r}")
    if not (isinstance(noise, (int, float)) and noise >= 0):
        raise UserError(f"noise must be a number >= 0, got {noise!r}")

    def node(level: int, k: int) -> tuple:
        name = f"n{level}_{k}" if level < depth else f"item{k}"
        props = tuple(f"{name}_p{j}" for j in range(properties_per_node))
        children = () if level == depth else (node(level + 1, 2 * k), node(level + 1, 2 * k + 1))
        return (name, props, children)

    return _from_tree(node(0, 0), noise=noise, seed=seed)


@dataclass
class SVDModes:
    """SVD of the input-output correlation ``Sigma_yx = U diag(S) V^T`` with levels.

    Attributes:
        U: ``[n_properties, k]`` output (property) singular vectors.
        S: ``[k]`` singular values, descending.
        V: ``[n_items, k]`` input (item) singular vectors.
        levels: Hierarchy level of each mode (see :func:`svd_modes`).
        input_variance: ``lambda`` with ``Sigma_x = lambda I`` (``1/P`` for one-hot items).
        level_purity: Fraction of each mode's item vector explained by its level.
    """

    U: Float[Tensor, "properties k"]
    S: Float[Tensor, " k"]
    V: Float[Tensor, "items k"]
    levels: list[int]
    input_variance: float
    level_purity: list[float]

    @property
    def target_strengths(self) -> Float[Tensor, " k"]:
        """Asymptotic mode strengths ``s / lambda`` of the network map ``W2 W1``."""
        return self.S / self.input_variance


def svd_modes(dataset: HierarchicalDataset, tol: float = 1e-6) -> SVDModes:
    """SVD of ``Sigma_yx = Y^T X / P`` (one-hot ``X``) and each mode's hierarchy level.

    The spans of the group indicators grow with depth (root ⊂ kingdom ⊂ ... ⊂ species).
    A mode's level is the depth that adds the most of its item vector's squared norm
    (exactly the depth where it first fits, for noise-free trees); ``level_purity`` is
    that fraction (1 for noise-free trees). Modes with singular value below ``tol`` times
    the largest are dropped.

    Args:
        dataset: The data.
        tol: Relative tolerance for dropping null modes.

    Returns:
        The :class:`SVDModes`.
    """
    P = dataset.n_items
    sigma_yx = dataset.targets.double().T / P  # [properties, items] (X = I)
    U, S, Vh = torch.linalg.svd(sigma_yx, full_matrices=False)
    keep = S > tol * S[0]
    U, S, V = U[:, keep], S[keep], Vh[keep].T
    projectors = []
    for nodes in dataset.groups:
        indicators = torch.zeros(P, len(nodes), dtype=torch.float64)
        for k, members in enumerate(nodes):
            indicators[members, k] = 1.0
        Q, _ = torch.linalg.qr(indicators)
        projectors.append(Q @ Q.T)
    levels, purity = [], []
    for a in range(S.shape[0]):
        v = V[:, a]
        captured = torch.stack([(proj @ v).norm() ** 2 for proj in projectors])  # nested spans
        new_energy = torch.diff(captured, prepend=captured.new_zeros(1))
        levels.append(int(new_energy.argmax()))
        purity.append(float(new_energy.max() / (v.norm() ** 2)))
    return SVDModes(U=U.float(), S=S.float(), V=V.float(), levels=levels, input_variance=1.0 / P, level_purity=purity)
