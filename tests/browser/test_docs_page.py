"""The API documentation in a real browser (Debian's chromium, headless), from a running
ingest on loopback: ``/docs`` renders the operations, and no request leaves loopback.

Any host name other than 127.0.0.1 resolves to nothing in this browser, so a page that
still pulled Swagger UI from a CDN would stay blank and fail here.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from onceflow.settings import Settings
from onceflow_tools.processes import free_port
from producers.api import create_app

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class NoKafka:
    async def send(self, envelopes):  # pragma: no cover - the docs do not submit
        raise AssertionError("no job submission in this test")

    def ready(self):
        return True

    def close(self):
        return 0


@pytest.fixture
def ingest_url() -> Iterator[str]:
    settings = Settings(auth_disabled=True, admin_api_enabled=True, ingest_validate_types=False)
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, NoKafka()), host="127.0.0.1", port=port, log_config=None
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="ingest", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "ingest did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser(tmp_path, monkeypatch):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are missing: run `make tools` (Debian packages)")
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium must not fetch a driver or browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _off_loopback(urls: list[str], base: str) -> list[str]:
    """Requests that would leave the machine (chrome:// and data: URLs do not)."""
    network = [u for u in urls if u.split(":", 1)[0] in ("http", "https", "ws", "wss", "ftp")]
    return [u for u in network if not u.startswith(f"{base}/")]


def _requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _wait_for(driver, css: str, timeout: float = 30):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def test_swagger_ui_renders_the_operations_from_loopback_only(browser, ingest_url):
    browser.get(f"{ingest_url}/docs")
    operation = _wait_for(browser, '.opblock-summary-path[data-path="/v1/jobs"]')
    assert operation.text.replace("\u200b", "") == "/v1/jobs"
    assert browser.find_elements("css selector", '[data-path="/v1/instances"]')
    urls = _requested_urls(browser)
    assert f"{ingest_url}/openapi.json" in urls
    assert any(u.endswith("/static-offline-docs/swagger-ui-bundle.js") for u in urls)
    assert _off_loopback(urls, ingest_url) == []


def test_no_redoc_page_whose_logo_would_come_from_a_cdn(browser, ingest_url):
    browser.get(f"{ingest_url}/redoc")
    assert '"error":"not_found"' in browser.page_source
    assert _off_loopback(_requested_urls(browser), ingest_url) == []
