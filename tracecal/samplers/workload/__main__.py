"""``python -m tracecal.samplers.workload``: one rank under torchrun, or a local launch of all ranks."""

import sys

from tracecal.samplers.workload.launch import main

if __name__ == "__main__":
    sys.exit(main())
