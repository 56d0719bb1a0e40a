"""Studies built on the core: MPSP sweeps, outcomes and reports, the LM induction testbed, the deep-linear-network toy."""
