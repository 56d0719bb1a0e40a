"""Benchmark of a cached ``interp-toolkit mechanism`` rerun against an uncached one.

Three command lines on the same run, each in a fresh process (what a user types), timed by
wall clock:

* ``uncached``: no analysis of the run is cached (its ``analyses/mechanism`` moved aside):
  five analyses on every checkpoint, the near miss, the figure;
* ``per-checkpoint caches``: every per-checkpoint analysis entry is cached, but not the
  mechanism's own result nor the record of the files it wrote (what a rerun cost before
  the result cache: torch, the data, every entry, the figure drawn again);
* ``cached``: a plain rerun: the result is read from one cache file and nothing is drawn
  when the figure and its data beside it are the ones written for that result;

and ``floor``: a fresh Python process reading that cache file with :mod:`json` (what
reading the cache costs at least). Each is repeated ``--repeats`` times (fastest kept: the
machines are shared and noisy). The run: ``--run-dir`` (any MPSP run), else a small one
trained here into a temporary directory (2 layers, 2 heads, 1,024 training examples of
length 5, 60 epochs, checkpoints every 10). Run::

    python benchmarks/bench_mechanism_cache.py
    python benchmarks/bench_mechanism_cache.py --run-dir runs/my_run --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def train_small_run(run_dir: Path) -> None:
    import torch

    from interp_toolkit import ModelConfig, TrainConfig, build_model, train
    from interp_toolkit.tasks.mpsp import MPSPConfig, make_splits

    torch.set_num_threads(1)
    task = MPSPConfig(seq_len=5, n_values=10, r=0.9, n_train=1024, n_eval=256, seed=0)
    model = build_model(ModelConfig(n_layers=2, n_heads=2, d_model=32, d_mlp=64, **task.model_dims()))
    train(model, make_splits(task), TrainConfig(epochs=60, eval_every=5, checkpoint_every=10,
                                                checkpoint_log_spaced=False, progress=False), run_dir)


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:  # the analyses' warnings are not the benchmark's output; a failure's are
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, help="an MPSP run (default: train a small one)")
    parser.add_argument("--repeats", type=int, default=2, help="timings per variant (fastest kept)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        run_dir = work / "run"
        if args.run_dir is not None:
            if not args.run_dir.is_dir():
                raise SystemExit(f"--run-dir {args.run_dir} is not a directory")
            shutil.copytree(args.run_dir, run_dir, ignore=shutil.ignore_patterns("analyses"))
        else:
            train_small_run(run_dir)
        mechanism_dir = run_dir / "analyses" / "mechanism"
        figure = work / "mechanism.png"
        command = [sys.executable, "-m", "interp_toolkit.cli", "mechanism", str(run_dir), "--out", str(figure),
                   "--no-progress"]
        seconds: dict[str, list[float]] = {"uncached": [], "per-checkpoint caches": [], "cached": [], "floor": []}
        for _ in range(args.repeats):
            shutil.rmtree(mechanism_dir, ignore_errors=True)
            seconds["uncached"].append(timed(command))
            shutil.rmtree(mechanism_dir / "results")
            (mechanism_dir / "written.json").unlink()
            seconds["per-checkpoint caches"].append(timed(command))
            seconds["cached"].append(timed(command))
            (entry,) = (mechanism_dir / "results").glob("*.json")
            seconds["floor"].append(timed([sys.executable, "-c", f"import json; json.load(open({str(entry)!r}))"]))
        best = {name: min(values) for name, values in seconds.items()}
        checkpoints = len(list((run_dir / "checkpoints").glob("epoch_*.safetensors")))
        print(f"mechanism on {checkpoints} checkpoints, fastest of {args.repeats} (wall clock, fresh process each):")
        print(f"{'variant':<24}{'seconds':>9}{'x cached':>10}")
        for name, value in best.items():
            print(f"{name:<24}{value:>9.2f}{value / best['cached']:>10.2f}")
        print(f"uncached / cached = {best['uncached'] / best['cached']:.1f}x; "
              f"per-checkpoint caches / cached = {best['per-checkpoint caches'] / best['cached']:.1f}x")


if __name__ == "__main__":
    main()
