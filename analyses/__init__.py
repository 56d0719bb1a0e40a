"""Reusable analysis modules (installed as ``interp_toolkit.analyses``)."""
