"""Reading a decoded GPT-NeoX run folder: ``decoded_run`` (kernel tables), ``neox_log`` (the training log),
``tables`` (module times and the published comparison), ``files`` (what an ingest reads), ``folder``
(recognising a run folder: the source's ``folder`` in the registry)."""
