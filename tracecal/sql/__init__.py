"""DuckDB side: connection and schema, loading runs, and the *.sql views users query."""
