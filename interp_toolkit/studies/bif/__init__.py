"""BIF studies on the core: one checkpoint's BIF command, and the deep-linear-network toy."""
