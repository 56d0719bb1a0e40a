"""The joined study: per-example BIF of MPSP training examples across a run's phases."""
