"""Microbenchmark samplers (torch), sample import, and the reference training workload."""
