"""Screenshots of the Airflow UI as a logged-in user sees it: Debian's headless Chromium driven
by Playwright, with an Airflow JWT as the UI's session cookie."""
from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def screenshots(airflow_url: str, token: str, shots: dict[str, str], text_of: str | None = None) -> str:
    """Each `{file name: path}` page rendered into docs/; returns the body text of `text_of` (a
    path) when asked. Every shot must be a rendered page, not a blank one."""
    from playwright.sync_api import sync_playwright

    DOCS.mkdir(exist_ok=True)
    text = ""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_cookies([{"name": "_token", "value": token, "url": airflow_url}])
            page = context.new_page()
            for name, path in shots.items():
                page.goto(airflow_url + path, wait_until="networkidle")
                page.wait_for_timeout(2500)
                page.screenshot(path=str(DOCS / name))
            if text_of:
                page.goto(airflow_url + text_of, wait_until="networkidle")
                text = page.inner_text("body")
        finally:
            browser.close()
    for name in shots:
        assert (DOCS / name).stat().st_size > 20_000, name
    return text
