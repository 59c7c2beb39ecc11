"""A decoded run's iteration rebuilt as rank traces: ``reconstruct`` (what every stage runs and when),
``pipeline_schedule`` (DeepSpeed's 1F1B instructions), ``rebuilt_trace`` (the events written down),
``load`` (the source's ``read_folder``: a run folder rebuilt into the ranks the ingest stores)."""
