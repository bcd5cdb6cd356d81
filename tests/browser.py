"""Screenshots of the Airflow UI as a logged-in user sees it: Debian's headless Chromium driven
by Playwright, with an Airflow JWT as the UI's session cookie."""
from __future__ import annotations

from pathlib import Path

from deploy.processes import wait_until

DOCS = Path(__file__).resolve().parent.parent / "docs"
RENDERED = 20_000       # bytes: a PNG of a blank or half-drawn page is smaller
RENDER_WAIT = 90        # seconds a page may take to draw on a loaded 2-core machine


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
                # The UI draws after its scripts and the plugin's iframe have loaded, which takes
                # longer than "networkidle" when the machine is busy: shoot until it is drawn.
                shot = DOCS / name
                page.wait_for_timeout(2500)

                def drawn() -> bool:
                    shot.write_bytes(page.screenshot())
                    return shot.stat().st_size > RENDERED

                wait_until(drawn, RENDER_WAIT, interval=2.5, what=f"{name} drawn")
            if text_of:
                page.goto(airflow_url + text_of, wait_until="networkidle")
                text = page.inner_text("body")
        finally:
            browser.close()
    for name in shots:
        assert (DOCS / name).stat().st_size > RENDERED, f"{name}: not drawn in {RENDER_WAIT} s"
    return text
