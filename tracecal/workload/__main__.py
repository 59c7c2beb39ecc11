"""``python -m tracecal.workload``: one rank under torchrun, or a local launch of all ranks."""

import sys

from tracecal.workload.launch import main

if __name__ == "__main__":
    sys.exit(main())
