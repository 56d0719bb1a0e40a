"""The language-model testbed: its training, the token-class BIF series across checkpoints, and its claims."""
