"""Dependency graph of the best iteration, discrete-event replay, component errors and figures."""
