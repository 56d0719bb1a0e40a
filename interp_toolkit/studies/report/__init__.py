"""The report of a study: tables of rates, plots against the clock, the markdown report."""
