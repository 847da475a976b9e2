"""Artifacts: uploaded checkpoints and datasets (safetensors only), content-addressed."""
