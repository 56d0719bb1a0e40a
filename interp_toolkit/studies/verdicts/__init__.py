"""The verdict engine: its rules, its rows, and every claim of both papers judged from committed tables."""
