"""Blobs seen from a worker on another host: a local content-addressed cache and the API client
that fills it and uploads outputs (docs/operations.md, "Workers on other hosts")."""
