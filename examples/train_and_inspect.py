"""Build MPSP splits, train a small model with checkpoints, reload the last checkpoint and
cache its attention patterns.

Run: python examples/train_and_inspect.py [--epochs 200] [--run-dir runs/example]
"""

import argparse

from interp_toolkit import (
    ModelConfig,
    TrainConfig,
    build_model,
    list_checkpoints,
    load_checkpoint,
    train,
)
from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--n-train", type=int, default=4096)
    parser.add_argument("--run-dir", default="runs/example")
    args = parser.parse_args()

    task = MPSPConfig(r=0.9, n_train=args.n_train)
    splits = make_splits(task)
    model = build_model(ModelConfig(n_layers=2, n_heads=2, **task.model_dims()))
    result = train(model, splits, TrainConfig(epochs=args.epochs), run_dir=args.run_dir)
    print("final:", {k: round(v, 4) for k, v in result.final.items()})

    epoch, path = list_checkpoints(args.run_dir)[-1]
    model, metadata = load_checkpoint(path)
    logits, cache = model.run_with_cache(splits["adv"].tokens[:8],
                                         names_filter=lambda name: name.endswith("hook_pattern"))
    pattern = cache["blocks.1.attn.hook_pattern"]
    print(f"checkpoint epoch {epoch}: layer-1 pattern {tuple(pattern.shape)}; readout attention of head 0 "
          f"on example 0: {[round(x, 2) for x in pattern[0, 0, -1].tolist()]}")


if __name__ == "__main__":
    main()
