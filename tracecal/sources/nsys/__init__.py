"""Nsight Systems exports (``.sqlite``, ``.sqlite.gz``, ``.nsys-rep``): ``parser`` splits a file into ranks,
``export`` opens it, ``tables`` and ``nvtx`` map its tables to events, ``payload`` reads NVTX payloads."""
