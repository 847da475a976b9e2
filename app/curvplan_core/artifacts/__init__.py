"""Artifact contents: the content-addressed blob store and the checks of what a file holds
(safetensors format, regular files, per-kind tensor checks), shared by the API and the workers."""
