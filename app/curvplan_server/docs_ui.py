"""The interactive API documentation (``/docs``), served with no network access.

FastAPI's default ``/docs`` page loads Swagger UI's script and style from a CDN, so it is
blank on a machine without internet access (most GPU clusters). Here the page refers to the
copy of Swagger UI 5 (it renders OpenAPI 3.1) that the ``swagger-ui-py`` package installs,
served under ``/docs/assets/``. The package's folder is found without importing it (its
``__init__`` loads web-framework adapters we do not use). ReDoc has no installable bundle and
is switched off.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Final

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from curvplan_server.problems import not_found

DOCS_PATH: Final = "/docs"
ASSETS_PATH: Final = f"{DOCS_PATH}/assets"
# The files the page needs, by name: nothing else under the package's folder is served.
ASSETS: Final = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}

router = APIRouter(include_in_schema=False)


@cache
def _assets_folder() -> Path:
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed (a dependency of curvplan[server])")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def _asset_file(name: str) -> Path:
    return _assets_folder() / name


@router.get(DOCS_PATH)
def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="curvplan API",
        swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
    )


@router.get(f"{ASSETS_PATH}/{{name}}")
def swagger_asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise not_found("documentation asset")
    return FileResponse(
        _asset_file(name),
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=86400"},
    )


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` from the installed Swagger UI (create the app with ``docs_url=None``)."""
    app.include_router(router)
