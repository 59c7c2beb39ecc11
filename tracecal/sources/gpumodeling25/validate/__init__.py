"""A decoded run scored like the published comparison: ``modules`` (the DeepSpeed frames a module is),
``module_times`` (their spans on the measured and replayed timelines), ``published`` (the published
rules, pure), ``published_runs`` (a stored run replayed and scored), ``attribution`` (the Table 9
cells' errors split by the schedule and the op families)."""
