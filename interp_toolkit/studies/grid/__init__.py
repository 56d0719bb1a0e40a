"""What a sweep is: its config, its cells, its study directory and its outcome tables."""
