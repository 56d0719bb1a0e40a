"""The mechanism over checkpoints: ablation, patching, fingerprints and gradients, and their contrast across runs."""
