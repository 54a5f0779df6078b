"""The Airflow UI as its users see it: Debian's chromium, driven by Playwright.

Only what a user does with a mouse and keyboard: log in on the login page, open pages from
the navigation, fill the backfill dialog. Screenshots go to the test's artifacts folder.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

# The React UI renders after its API calls: generous, as the scheduler shares two cores.
TIMEOUT_MS = 60_000


@dataclass
class AirflowUI:
    page: Page
    base: str
    artifacts: Path

    def screenshot(self, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        self.page.screenshot(path=path, full_page=True)
        return path

    def open(self, path: str) -> None:
        self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")

    def log_in(self, username: str, password: str) -> None:
        self.open("/")
        assert "/auth/login" in self.page.url, f"no login page: {self.page.url}"
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.screenshot("01-login")
        self.page.locator("button", has_text="Sign in").click()
        self.page.wait_for_url(lambda url: "/auth/login" not in url)
        self.page.wait_for_load_state("networkidle")

    def open_from_browse_menu(self, item: str) -> None:
        """A plugin page, as a user reaches it: Browse, then the item."""
        self.page.get_by_role("button", name="Browse").click()
        self.page.get_by_role("menuitem", name=item).click()
        self.page.wait_for_load_state("networkidle")

    def plugin_frame_text(self) -> str:
        """The text of the page a plugin view shows in its frame."""
        frame = self.page.frame_locator("iframe").first
        frame.locator("body > *").first.wait_for()
        return frame.locator("body").inner_text()

    def backfill(self, dag_id: str, first: date, last: date) -> dict:
        """Fill the DAG's backfill dialog with nothing but the dates; submit it. Returns what
        the dialog posted to the API."""
        self.open(f"/dags/{dag_id}")
        self.page.locator("button", has_text="Trigger").first.click()
        dialog = self.page.get_by_role("dialog")
        dialog.locator("label", has_text="Backfill").first.click()
        for field, day in ((0, first), (1, last)):
            dialog.locator("[data-testid=datetime-input]").nth(field).click()
            picker = self.page.locator(
                "[data-scope=popover][data-part=content][data-state=open]").last
            picker.get_by_placeholder("YYYY/MM/DD").fill(f"{day:%Y/%m/%d}")
            picker.get_by_placeholder("HH:mm").fill("00:00")
            dialog.get_by_text("Date Range").click()  # closes the picker
            picker.wait_for(state="hidden")
        # The dialog counts the runs the range will create before it can be submitted.
        dialog.get_by_text("will be triggered", exact=False).first.wait_for()
        self.screenshot("10-backfill-dialog")
        with self.page.expect_request(
                lambda request: request.method == "POST"
                and request.url.endswith("/api/v2/backfills")) as posted:
            dialog.locator("button", has_text="Run Backfill").click()
        dialog.wait_for(state="hidden")  # the dialog closes once the backfill exists
        self.screenshot("11-backfill-submitted")
        return json.loads(posted.value.post_data or "{}")

    def open_dags_from_the_menu(self, dag_ids: list[str]) -> None:
        """Each DAG's page, reached from the Dags list; the page names its DAG."""
        for dag_id in dag_ids:
            self.page.get_by_role("link", name="Dags", exact=True).first.click()
            self.page.get_by_role("link", name=dag_id, exact=True).first.click()
            self.page.wait_for_url(f"**/dags/{dag_id}**")
            self.page.get_by_role("heading", name=dag_id).first.wait_for()
            self.screenshot(f"05-dag-{dag_id}")


@contextmanager
def airflow_ui(base: str, artifacts: Path) -> Iterator[AirflowUI]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by `make setup`"
    artifacts.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            yield AirflowUI(page, base, artifacts)
        finally:
            browser.close()
