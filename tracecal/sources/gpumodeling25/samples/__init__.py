"""The published GPUModeling25 per-operator samples imported as ``samples`` rows: ``importer`` reads the
CSVs, ``ops`` maps each op file to the forward call it timed."""
