"""Model configuration and construction on TransformerLens 4's ``TransformerBridge``.

``build_model`` returns a native ``TransformerBridge`` (``boot_native``), so every
TransformerLens hook point (``blocks.0.attn.hook_pattern`` ...), ``run_with_cache``,
``run_with_hooks`` and weight accessor (``W_Q``, ``OV``, ``QK``) works on it, and no
hub access is needed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from interp_toolkit.config import Config, check_seed
from interp_toolkit.errors import UserError

if TYPE_CHECKING:  # torch is imported by build_model's TransformerLens, not here: a config needs no torch
    import torch
    from torch import Tensor
    from transformer_lens.model_bridge import TransformerBridge


class HookedModel(Protocol):
    """What the analyses use of a model: TransformerLens's hook API and weight accessors, and
    the ``nn.Module`` basics.

    A ``TransformerBridge`` (:func:`build_model`, :func:`interp_toolkit.load_checkpoint`,
    ``TransformerBridge.boot_transformers``) has all of it (mypy checks that, see
    ``_bridge_is_a_hooked_model``), and so does a ``HookedTransformer``.
    """

    training: bool

    @property
    def cfg(self) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]: ...

    def state_dict(self) -> Mapping[str, Any]: ...

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    @property
    def W_E(self) -> Tensor: ...

    @property
    def W_U(self) -> Tensor: ...

    @property
    def W_Q(self) -> Tensor: ...

    @property
    def W_K(self) -> Tensor: ...

    @property
    def W_V(self) -> Tensor: ...

    @property
    def W_O(self) -> Tensor: ...

    @property
    def QK(self) -> Any: ...

    @property
    def OV(self) -> Any: ...


if TYPE_CHECKING:
    def _bridge_is_a_hooked_model(model: TransformerBridge) -> HookedModel:
        return model  # mypy fails here if HookedModel asks for more than a TransformerBridge has

_ACT_FNS = ("relu", "gelu", "gelu_new", "silu", "solu_ln", "gelu_fast")
_POSITIONAL = ("standard", "rotary", "shortformer")
_NORMALIZATION = ("LN", None)
#: Initialization schemes: TransformerLens 4's ``boot_native`` init, or every layer reset to
#: PyTorch's own ``nn.Embedding`` / ``nn.Linear`` / ``nn.LayerNorm`` defaults.
_INITS = ("transformer_lens", "torch")
#: Fields added after run keys were first issued, with the default under which they are left
#: out of ``to_dict`` (and so of every run key): runs made before they existed keep their keys.
_KEYED_ONLY_WHEN_SET = {"init": "transformer_lens", "init_scale": 1.0}

#: Sanity bound on ``n_layers``: the bridge builds its blocks one by one, so a typo such as
#: ``--model.n-layers 99999`` would otherwise spend minutes building before any output.
MAX_LAYERS = 512


@dataclass
class ModelConfig(Config):
    """Validated architecture of a small transformer.

    Attributes:
        n_layers: Number of transformer blocks (>= 1).
        n_heads: Attention heads per block (>= 1).
        d_vocab: Input vocabulary size (tokens are ``0 .. d_vocab - 1``).
        n_ctx: Maximum sequence length.
        d_vocab_out: Output classes of the unembedding (defaults to ``d_vocab``).
        d_model: Residual stream width.
        d_head: Width of each head; defaults to ``d_model // n_heads``.
        d_mlp: Hidden width of each MLP (ignored when ``attn_only``).
        act_fn: MLP activation, one of ``relu, gelu, gelu_new, silu, solu_ln, gelu_fast``.
        normalization: ``"LN"`` (LayerNorm) or ``None`` (no normalization).
        attn_only: If True, blocks have no MLP.
        positional_embedding: ``"standard"`` (learned absolute), ``"rotary"`` or
            ``"shortformer"``.
        seed: Seed of the weight initialization; same seed, same weights.
        init: ``"transformer_lens"`` (TransformerLens 4's ``boot_native`` init: embeddings
            and input projections with std ~0.1 at d_model 64, zero biases) or ``"torch"``
            (every layer as PyTorch's defaults build it: embeddings N(0, 1), linear weights
            and biases uniform in +-1/sqrt(fan_in)). A paper that states no initialization
            leaves this a choice; it changes how large the weights start relative to what
            weight decay pulls them to.
        init_scale: Multiplies every weight matrix and embedding after ``init`` (LayerNorm
            weights and biases are left alone): the initialization scale alpha of the
            grokking literature.
    """

    n_layers: int
    n_heads: int
    d_vocab: int
    n_ctx: int
    d_vocab_out: int | None = None
    d_model: int = 64
    d_head: int | None = None
    d_mlp: int = 128
    act_fn: str = "relu"
    normalization: str | None = "LN"
    attn_only: bool = False
    positional_embedding: str = "standard"
    seed: int = 0
    init: str = "transformer_lens"
    init_scale: float = 1.0

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "d_vocab", "n_ctx", "d_model", "d_mlp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.n_layers > MAX_LAYERS:
            raise UserError(f"ModelConfig.n_layers must be at most {MAX_LAYERS} (a sanity bound), got "
                             f"{self.n_layers}")
        if self.d_vocab_out is None:
            self.d_vocab_out = self.d_vocab
        if isinstance(self.d_vocab_out, bool) or not isinstance(self.d_vocab_out, int) or self.d_vocab_out < 1:
            raise UserError(f"ModelConfig.d_vocab_out must be a positive integer, got {self.d_vocab_out!r}")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise UserError(
                    f"ModelConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "set d_head explicitly"
                )
            self.d_head = self.d_model // self.n_heads
        if isinstance(self.d_head, bool) or not isinstance(self.d_head, int) or self.d_head < 1:
            raise UserError(f"ModelConfig.d_head must be a positive integer, got {self.d_head!r}")
        if self.act_fn not in _ACT_FNS:
            raise UserError(f"ModelConfig.act_fn must be one of {_ACT_FNS}, got {self.act_fn!r}")
        if self.normalization not in _NORMALIZATION:
            raise UserError(
                f"ModelConfig.normalization must be 'LN' or None, got {self.normalization!r}"
            )
        if self.positional_embedding not in _POSITIONAL:
            raise UserError(
                f"ModelConfig.positional_embedding must be one of {_POSITIONAL}, "
                f"got {self.positional_embedding!r}"
            )
        if not isinstance(self.attn_only, bool):
            raise UserError(f"ModelConfig.attn_only must be a bool, got {self.attn_only!r}")
        check_seed("ModelConfig.seed", self.seed, "the init seed")
        if self.init not in _INITS:
            raise UserError(f"ModelConfig.init must be one of {_INITS}, got {self.init!r}")
        if (isinstance(self.init_scale, bool) or not isinstance(self.init_scale, (int, float))
                or not math.isfinite(self.init_scale) or self.init_scale <= 0):
            raise UserError(f"ModelConfig.init_scale must be a positive finite number, got {self.init_scale!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field, except ``init`` / ``init_scale`` at their defaults (see
        :data:`_KEYED_ONLY_WHEN_SET`: run keys issued before they existed stay valid)."""
        data = super().to_dict()
        for name, default in _KEYED_ONLY_WHEN_SET.items():
            if data[name] == default:
                del data[name]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def n_parameters(cfg: ModelConfig) -> int:
    """Parameters of the model ``cfg`` describes (weights and biases of the embeddings,
    every block and the unembedding), computed from the config alone."""
    d, hd = cfg.d_model, cfg.n_heads * (cfg.d_head or cfg.d_model // cfg.n_heads)
    norms = 2 * d if cfg.normalization == "LN" else 0
    attention = 4 * d * hd + 3 * hd + d
    mlp = 0 if cfg.attn_only else 2 * d * cfg.d_mlp + cfg.d_mlp + d + norms
    block = attention + norms + mlp
    positions = cfg.n_ctx * d if cfg.positional_embedding == "standard" else 0
    return cfg.d_vocab * d + positions + cfg.n_layers * block + norms + d * int(cfg.d_vocab_out or cfg.d_vocab)


def available_memory(device: Any) -> int | None:
    """Bytes free on ``device`` (a CUDA device's free memory, else the host's available
    memory: ``MemAvailable`` of ``/proc/meminfo``, which counts reclaimable page cache);
    None when it cannot be read."""
    import torch

    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_model_size(cfg: ModelConfig, device: Any = None) -> None:
    """Refuse, before anything is built, a model whose training state cannot fit: float32
    weights, gradients and AdamW's two moments (4 copies of the parameters) against the
    memory available on ``device``.

    Raises:
        UserError: Naming the sizes in the config, the parameter count and the memory.
    """

    needed = 4 * 4 * n_parameters(cfg)
    free = available_memory(device)
    if free is not None and needed > free:
        raise UserError(
            f"the model (n_layers {cfg.n_layers}, d_model {cfg.d_model}, d_mlp {cfg.d_mlp}, n_heads {cfg.n_heads}) "
            f"has {n_parameters(cfg):,} parameters: training it needs ~{needed / 2**30:.1f} GiB (weights, "
            f"gradients and AdamW state in float32), more than the {free / 2**30:.1f} GiB available on "
            f"{device or 'cpu'}; choose a smaller model")


def bridge_config(cfg: ModelConfig) -> Any:
    """The ``TransformerBridgeConfig`` that ``boot_native`` needs for ``cfg``."""
    from transformer_lens.config import TransformerBridgeConfig

    # __post_init__ derives both when they are not given
    assert cfg.d_head is not None and cfg.d_vocab_out is not None
    return TransformerBridgeConfig(
        n_layers=cfg.n_layers,
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_heads=cfg.n_heads,
        d_mlp=cfg.d_mlp,
        d_vocab=cfg.d_vocab,
        n_ctx=cfg.n_ctx,
        act_fn=cfg.act_fn,
        normalization_type=cfg.normalization,
        d_vocab_out=cfg.d_vocab_out,
        attn_only=cfg.attn_only,
        positional_embedding_type=cfg.positional_embedding,
        seed=cfg.seed,
    )


def build_model(cfg: ModelConfig, device: str | torch.device | None = None) -> Any:
    """Build a freshly initialized TransformerLens ``TransformerBridge`` for ``cfg``.

    The model carries its ``ModelConfig`` as ``model.interp_config`` so that
    :func:`interp_toolkit.save_checkpoint` can make a self-describing file.

    Args:
        cfg: The architecture.
        device: Optional device to place the model on.

    Returns:
        A ``transformer_lens.model_bridge.TransformerBridge`` built with ``boot_native``.
    """
    from transformer_lens.model_bridge import TransformerBridge

    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(cfg).__name__}")
    check_model_size(cfg, device)
    # boot_native is attached to the class when TransformerLens is imported: mypy cannot see it
    model = TransformerBridge.boot_native(bridge_config(cfg), device=device)  # type: ignore[attr-defined]
    reinitialize(model, cfg)
    model.interp_config = cfg
    return model


def reinitialize(model: Any, cfg: ModelConfig) -> None:
    """Apply ``cfg.init`` and ``cfg.init_scale`` to a freshly booted bridge, in place.

    ``"torch"`` resets every ``nn.Embedding``, ``nn.Linear`` and ``nn.LayerNorm`` inside the
    bridge with its own ``reset_parameters`` under ``torch.manual_seed(cfg.seed)`` (the global
    random state is restored after), so the same seed gives the same weights. Then every
    parameter with two or more dimensions is multiplied by ``init_scale``.
    """
    import torch
    from torch import nn

    if cfg.init == "torch":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            for module in model.modules():
                if isinstance(module, (nn.Embedding, nn.Linear, nn.LayerNorm)):
                    module.reset_parameters()
    if cfg.init_scale != 1.0:
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() >= 2:
                    param.mul_(cfg.init_scale)


def move_model(model: Any, device: str | torch.device) -> Any:
    """Move ``model`` to ``device`` without TransformerLens's "Moving model to device" line.

    TransformerLens models (``TransformerBridge``, ``HookedTransformer``) print that line on
    every ``.to(device)`` unless told not to; loading each checkpoint of a run would print it
    once per checkpoint. Other modules are moved with a plain ``.to``.

    Args:
        model: A ``torch.nn.Module``.
        device: Where to put it.

    Returns:
        The moved model (the same object for TransformerLens models).
    """
    if type(model).__module__.startswith("transformer_lens."):
        return model.to(device, print_details=False)
    return model.to(device)


def model_config_of(model: Any) -> ModelConfig:
    """The ``ModelConfig`` of a toolkit model: the one it was built from
    (``model.interp_config``), else the one derived from a ``TransformerBridge``'s own config.

    A derived config is accepted only when :func:`build_model` of it makes the same parameters
    (names and shapes) as ``model``, so that its checkpoints load back into the same model.

    Raises:
        ValueError: ``model`` carries no ``ModelConfig`` and none can be derived that rebuilds it.
    """
    cfg = getattr(model, "interp_config", None)
    if isinstance(cfg, ModelConfig):
        return cfg
    derived = derived_model_config(model)
    if derived is None:
        raise UserError(
            f"model ({type(model).__name__}) has no interp_toolkit ModelConfig and none can be derived "
            "from it: build it with interp_toolkit.build_model, load it with load_checkpoint, or pass "
            "model_config=ModelConfig(...) that rebuilds it"
        )
    return derived


_BRIDGE_FIELDS = {"n_layers": "n_layers", "n_heads": "n_heads", "d_vocab": "d_vocab", "n_ctx": "n_ctx",
                  "d_vocab_out": "d_vocab_out", "d_model": "d_model", "d_head": "d_head", "d_mlp": "d_mlp",
                  "act_fn": "act_fn", "normalization": "normalization_type", "attn_only": "attn_only",
                  "positional_embedding": "positional_embedding_type", "seed": "seed"}


def derived_model_config(model: Any) -> ModelConfig | None:
    """The ``ModelConfig`` read from a ``TransformerBridge``'s ``cfg``, or ``None`` when the
    model has no such config or :func:`build_model` of it would not make the same parameters
    (names and shapes; e.g. a bridge around a Hugging Face model with its own architecture)."""
    bridge_cfg = getattr(model, "cfg", None)
    if bridge_cfg is None or not hasattr(model, "state_dict"):
        return None
    try:
        values = {name: getattr(bridge_cfg, attr) for name, attr in _BRIDGE_FIELDS.items()}
        if values["seed"] is None:
            values["seed"] = 0
        cfg = ModelConfig(**values)
        rebuilt = build_model(cfg, device="meta")
    except Exception:  # any config the toolkit cannot express: not derivable
        return None
    own = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    return cfg if own == {name: tuple(t.shape) for name, t in rebuilt.state_dict().items()} else None


__all__ = ["MAX_LAYERS", "HookedModel", "ModelConfig", "available_memory", "build_model", "bridge_config",
           "check_model_size", "derived_model_config", "model_config_of", "move_model", "n_parameters"]
