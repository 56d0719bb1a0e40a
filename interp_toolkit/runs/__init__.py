"""Training runs: the run record, the trainer, the many-seeds trainer, the fast readout engine,
run-directory locks and resume state."""
