"""Stand-in for the torch package of a PyTorch checkout (sources to analyse, not to import)."""

__version__ = "2.13.0a0+sample"
