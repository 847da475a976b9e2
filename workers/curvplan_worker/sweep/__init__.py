"""Sweeps: the training runs of batch-size and dataset-size sweeps (torch)."""
