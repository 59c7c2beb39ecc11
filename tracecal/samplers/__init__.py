"""Microbenchmark samplers (torch) and sample import."""
