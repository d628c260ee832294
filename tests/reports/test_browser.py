"""The report in a real browser: Debian's headless Chromium driven by Playwright (no `playwright install`).

Runs by default; a machine without /usr/bin/chromium fails with how to get it (`make browser`), unless
TOOLKIT_SKIP_BROWSER_TESTS=1 says to skip.
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.reports.conftest import ERROR_BODY, EVIL_ERROR, EVIL_MODEL, SECTION_IDS

CHROMIUM = os.environ.get("TOOLKIT_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


pytestmark = pytest.mark.skipif(os.environ.get("TOOLKIT_SKIP_BROWSER_TESTS") == "1",
                                reason="TOOLKIT_SKIP_BROWSER_TESTS=1")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Checked before the session's bench fixtures run, so a machine without Chromium fails at once."""
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make browser` (apt-get install chromium), or set "
                    "TOOLKIT_SKIP_BROWSER_TESTS=1 to skip the browser tests", pytrace=False)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[dev]'", pytrace=False)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium):
    """Module-scoped: Playwright's sync API keeps an event loop running, which must not outlive this module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield launched
        launched.close()


def _open(browser, path: Path):
    """A page with the report loaded; returns (page, console errors, requests that were not the file itself)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))

    def route(r) -> None:
        if r.request.url.startswith(("file:", "data:")):
            r.continue_()
        else:
            foreign.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri(), wait_until="load")
    return page, errors, foreign


def test_the_report_renders_in_chromium_and_runs_nothing_from_the_log(chromium, report_file, browser):
    page, errors, foreign = _open(browser, report_file)
    assert errors == [] and foreign == []
    assert page.title() == "Stub sweep"
    assert page.evaluate("[window.__pwned, window.__pwned_unread]") == [None, None]
    assert page.evaluate("document.scripts.length") == 0
    for section in SECTION_IDS:
        loc = page.locator(f"section#{section}")
        assert loc.count() == 1 and loc.is_visible(), section
        assert loc.bounding_box()["height"] > 40, section
    diagnosis = page.locator("section#diagnosis").inner_text()
    assert EVIL_ERROR in diagnosis
    assert EVIL_MODEL in page.locator("section#config").inner_text()
    assert ERROR_BODY in page.locator("#failed").inner_text()
    assert page.locator("#failed b").count() == 0
    sizes = page.evaluate("[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(sizes) == 3 and all(ok and w > 500 and h > 200 for ok, w, h in sizes), sizes  # with the Pareto plot
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("L"), dtype=float)
    assert shot.shape[0] > 2000 and shot.std() > 20, (shot.shape, shot.std())
    assert len(np.unique(shot)) > 50
    page.close()
