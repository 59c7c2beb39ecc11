"""GPUModeling25 decoded runs: the GPT-NeoX/DeepSpeed run folders the published GPUModeling25 decoder
leaves (per-kernel tables of three ranks, measured module times, the training log; no traces).

Its sub-packages are layers, each importing only those below it (pyproject's import-linter contracts):

* ``validate`` — the published comparison ("Table 9"): module times read off a replayed decoded run
  and scored with the published rules (above ``tracecal.predict``, whose replay it reads);
* ``relayout`` — the run rebuilt at another parallel layout, the source's ``relayout`` capability
  (above ``tracecal.predict``, whose layout rules and shape maps it uses);
* ``samples`` — the published per-operator sample CSVs imported as ``samples`` rows (above
  ``tracecal.samplers``);
* ``rebuild`` — one training iteration rebuilt as the rank traces DeepSpeed would write;
* ``read`` — the run folder read: kernel tables, module times, the GPT-NeoX log.
"""

from tracecal.sources.gpumodeling25.read.folder import DECODED_FORMAT
from tracecal.sources.registry import Source

SOURCE = Source(
    name=DECODED_FORMAT,
    description="a decoded GPT-NeoX run of the published GPUModeling25 decoder (kernel tables 0/ 1/ 2/, a *.log)",
    folder="tracecal.sources.gpumodeling25.read.folder:decoded_job_dir",
    read_folder="tracecal.sources.gpumodeling25.rebuild.load:read_folder",
    relayout="tracecal.sources.gpumodeling25.relayout:DecodedRelayout",
)
"""The GPUModeling25 source (``tracecal.sources.registry``): a folder source, rebuilt in the loading process,
whose runs ``predict --layout`` and ``search`` rebuild at other layouts."""
