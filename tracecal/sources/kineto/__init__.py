"""Kineto (torch.profiler / PyTorch Kineto) JSON traces: ``parser`` reads a document, ``events`` its events."""
