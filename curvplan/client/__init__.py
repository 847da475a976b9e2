"""The curvplan Python client (httpx): :class:`Client` and :class:`AsyncClient`.

```python
import curvplan

with curvplan.Client() as api:              # CURVPLAN_URL, CURVPLAN_API_KEY
    ckpt = api.upload_artifact("ckpt.safetensors", "checkpoint")
    data = api.upload_artifact("data.safetensors", "dataset")
    job = api.submit_analyze(spec, ckpt, data, name="gpt-small-pilot")
    job = api.wait(job.id, on_progress=lambda j: print(j.status, j.progress))
    rec = api.get_recommendation(job.id)   # curvplan.types.planner.Recommendation
```
"""

from curvplan.client._common import API_KEY_ENV, DEFAULT_URL, URL_ENV, RetryPolicy
from curvplan.client.aio import AsyncClient
from curvplan.client.errors import (
    ArtifactIntegrityError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ConnectionFailedError,
    CurvplanError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
    UnsupportedMediaTypeError,
    ValidationFailedError,
    WaitTimeoutError,
)
from curvplan.client.sync import Client

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_URL",
    "URL_ENV",
    "ArtifactIntegrityError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ConnectionFailedError",
    "CurvplanError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailableError",
    "UnsupportedMediaTypeError",
    "ValidationFailedError",
    "WaitTimeoutError",
]
