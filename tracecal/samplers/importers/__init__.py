"""Importers of sample sets measured by other tools (``tracecal samples import --format ...``)."""
