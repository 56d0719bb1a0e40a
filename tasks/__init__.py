"""Datasets for interp-toolkit studies (installed as ``interp_toolkit.tasks``)."""
