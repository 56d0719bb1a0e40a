"""What every study reads: a run's outcome from its metrics, near misses, and the statistics of rates."""
