"""Trace files -> Arrow record batches: run discovery, rank detection, Kineto and Nsight parsing."""
