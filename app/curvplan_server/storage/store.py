"""The API process's blob store (``$CURVPLAN_DATA_DIR/blobs``), made on first use.

The artifact, storage and worker-blob routes all read and write through it.
"""

from __future__ import annotations

from fastapi import Request

from curvplan_core.artifacts.blobstore import BlobStore, default_store


def blob_store(request: Request) -> BlobStore:
    """The application's blob store (``$CURVPLAN_DATA_DIR/blobs``)."""
    store = getattr(request.app.state, "blob_store", None)
    if store is None:
        store = default_store(request.app.state.settings.data_dir)
        store.ensure()
        request.app.state.blob_store = store
    return store
