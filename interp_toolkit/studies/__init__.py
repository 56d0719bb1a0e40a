"""Studies built on the core: MPSP sweeps, outcomes, reports and the mechanism figure over
checkpoints, the LM induction testbed, the deep-linear-network toy."""
