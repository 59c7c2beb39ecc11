"""DuckDB side: the connection and schema, the loaders (inserting and replacing rows), and the views."""
