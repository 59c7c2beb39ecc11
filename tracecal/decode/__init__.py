"""Arrow/polars frames of events -> operators, collectives, iterations (pure transforms, no I/O)."""
