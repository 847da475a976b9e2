"""``/docs`` works without network access: Swagger UI comes from the installed package."""

from __future__ import annotations

import re

import httpx
import pytest
from chromium import find_chromium, run_chromium
from live_plugin import LiveService

pytestmark = pytest.mark.e2e

REFERENCE = re.compile(r"""(?:src|href)="([^"]+)\"""")


def test_docs_page_refers_only_to_its_own_assets(live: LiveService) -> None:
    page = httpx.get(f"{live.url}/docs", timeout=10)
    assert page.status_code == 200
    references = REFERENCE.findall(page.text)
    assert references, page.text
    assert "cdn." not in page.text and "//" not in "".join(references)  # nothing off-site
    for ref in references:
        asset = httpx.get(f"{live.url}{ref}", timeout=10)
        assert asset.status_code == 200, ref
        assert len(asset.content) > 500, ref
    # Only the named files are served, nothing else of the package's folder.
    other = httpx.get(f"{live.url}/docs/assets/swagger-ui-bundle.js.map", timeout=10)
    assert other.status_code == 404
    assert other.headers["content-type"].startswith("application/problem+json")


def test_docs_page_renders_the_operations_in_chromium(live: LiveService) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium is not installed and could not be installed (ensure_chromium.sh)")
    # The machine reaches no CDN: a page that loaded Swagger UI from one would stay empty.
    run = run_chromium(binary, f"{live.url}/docs", "--dump-dom", "--virtual-time-budget=10000")
    assert 'class="opblock' in run.stdout, run.stdout[-2000:]
    assert "/v1/jobs" in run.stdout
