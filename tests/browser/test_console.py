"""The console in a real browser (Debian's chromium, headless) against the real stack:
ingest, the streams worker and the engine as subprocesses with the sample workflows,
and ``onceflow console`` itself as a subprocess. A user logs in with a key, reads the
overview, filters to a params mismatch, opens the instance, pauses and resumes it,
bulk-terminates a filtered set and re-drives a dead letter. Nothing leaves loopback.

With ``ONCEFLOW_TEST_SCREENSHOTS_DIR`` set, a screenshot of each page is saved there
(``docs/console/*.png`` come from such a run).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from onceflow.envelope import JobEnvelope
from onceflow.vocabulary import InstanceStatus
from onceflow_tools.processes import free_port
from onceflow_tools.stack import Stack
from tests.browser.test_docs_page import (
    _off_loopback,
    _requested_urls,
    browser,  # noqa: F401  (the fixture)
)
from workflow_engine.store.views import dead_letters_for, describe_instance

SHOTS = os.environ.get("ONCEFLOW_TEST_SCREENSHOTS_DIR")


@pytest.fixture
def stack(base_settings, tmp_path):
    s = Stack(base_settings, f"console-{uuid.uuid4().hex[:8]}", tmp_path / "run").prepare()
    s.start_ingest()
    s.start_worker()
    s.start_engine()
    yield s
    s.close()


@pytest.fixture
def console_url(stack) -> str:
    assert stack.group is not None
    port, metrics = free_port(), free_port()
    env = {"ONCEFLOW_CONSOLE_PORT": str(port), "ONCEFLOW_CONSOLE_METRICS_PORT": str(metrics)}
    stack.group.start("console", "console", env=env)
    stack.group.wait_http(f"http://127.0.0.1:{metrics}/readyz", timeout=60)
    stack.group.wait_http(f"http://127.0.0.1:{port}/login", timeout=60)
    return f"http://127.0.0.1:{port}"


def shot(driver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.set_window_size(1400, 1000)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def wait_css(driver, css: str, timeout: float = 30):
    return WebDriverWait(driver, timeout).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def wait_text(driver, css: str, text: str, timeout: float = 30) -> None:
    WebDriverWait(driver, timeout).until(
        expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, css), text)
    )


def click(driver, css: str) -> None:
    driver.find_element(By.CSS_SELECTOR, css).click()


def confirm(driver) -> None:
    wait_css(driver, "#confirm")
    click(driver, "#confirm")


def produce_unknown_type(stack) -> None:
    """A record naming no registered workflow, straight to the topic: dead-lettered."""
    envelope = JobEnvelope("ghost_0001", "no-such-workflow", {"x": 1}, None)
    producer = Producer({"bootstrap.servers": stack.settings.kafka_bootstrap_servers})
    producer.produce(
        stack.settings.jobs_topic,
        key=envelope.key(),
        value=envelope.encode(),
        headers=envelope.headers(),
    )
    assert producer.flush(30) == 0


@pytest.mark.timeout(300)
def test_an_operator_reads_filters_acts_and_redrives(stack, console_url, browser):  # noqa: F811
    approval = {"workflow": "approval-workflow"}
    holds = [{"job_id": f"hold_{i:03d}", **approval, "params": {"n": i}} for i in range(5)]
    orders = [
        {"job_id": f"order_{i:03d}", "workflow": "order-workflow", "params": {"amount": i}}
        for i in range(6)
    ]
    with stack.client() as client:
        client.submit([{"job_id": "appr_0001", **approval, "params": {"who": "a"}}])
        client.submit([*holds, *orders])
        client.submit(orders[:3])  # duplicates
        client.submit([{"job_id": "appr_0001", **approval, "params": {"who": "b"}}])  # mismatch
    produce_unknown_type(stack)
    stack.wait_for(
        lambda: (
            stack.scalar("SELECT count(*) FROM onceflow_instances WHERE status = 'waiting'") == 6
            and stack.scalar("SELECT count(*) FROM onceflow_instances WHERE status = 'complete'")
            == 6
            and stack.scalar("SELECT count(*) FROM onceflow_duplicate_deliveries") == 4
            and len(dead_letters_for(stack.db, "ghost_0001")) == 1
        ),
        120,
        "approvals waiting, orders complete, duplicates and the dead letter recorded",
    )

    # Log in with the stack's key (every scope).
    browser.get(f"{console_url}/")
    wait_css(browser, "#api_key").send_keys(stack.api_key)
    click(browser, "form[action='/login'] button[type=submit]")

    # Overview: counts per workflow, lag, dead letters by reason; refreshed by htmx.
    wait_css(browser, "#counts")
    counts = browser.find_element(By.CSS_SELECTOR, "#counts").text
    assert "approval-workflow" in counts and "order-workflow" in counts
    wait_text(browser, "#dead-reasons", "unknown_type")
    assert browser.find_element(By.CSS_SELECTOR, "#lag-total").text.isdigit()
    browser.execute_script("document.getElementById('overview').dataset.seen = '1'")
    assert browser.execute_script("return document.getElementById('overview').dataset.seen")
    WebDriverWait(browser, 20).until(  # the fragment was swapped in: the marker is gone
        lambda d: (
            d.execute_script("return document.getElementById('overview').dataset.seen") is None
        )
    )
    shot(browser, "overview")

    # Filter to the params mismatch.
    click(browser, "nav a[href='/instances']")
    wait_css(browser, "#filter-form")
    Select(browser.find_element(By.NAME, "payload_mismatch")).select_by_value("true")
    click(browser, "#apply-filter")
    wait_text(browser, "#match-count", "1 matching")
    rows = browser.find_elements(By.CSS_SELECTOR, "#instances tbody tr")
    assert len(rows) == 1 and "appr_0001" in rows[0].text
    shot(browser, "instances")

    # The instance: its timeline tells the mismatch.
    click(browser, "#instances a[href='/instances/appr_0001']")
    wait_css(browser, "#timeline")
    timeline = browser.find_element(By.CSS_SELECTOR, "#timeline").text
    assert "instance created" in timeline and "PAYLOAD MISMATCH" in timeline
    assert browser.find_element(By.CSS_SELECTOR, "#mismatches").text == "1"
    assert "job_trace('appr_0001')" in browser.find_element(By.CSS_SELECTOR, "#trace-sql").text
    shot(browser, "instance")

    # Pause, then resume (each through its confirmation page).
    click(browser, "#action-pause")
    confirm(browser)
    wait_text(browser, "#status", "paused")
    assert describe_instance(stack.db, "appr_0001").status == InstanceStatus.PAUSED
    click(browser, "#action-resume")
    confirm(browser)
    wait_css(browser, "#done")
    assert describe_instance(stack.db, "appr_0001").status != InstanceStatus.PAUSED

    # Bulk-terminate the held approvals: the count is shown before anything changes.
    browser.get(f"{console_url}/instances?job_id_prefix=hold_")
    wait_text(browser, "#match-count", "5 matching")
    Select(browser.find_element(By.ID, "bulk-action")).select_by_value("terminate")
    click(browser, "#bulk-submit")
    wait_text(browser, "#confirm-count", "5")
    assert stack.scalar("SELECT count(*) FROM onceflow_instances WHERE status = 'terminated'") == 0
    confirm(browser)
    wait_text(browser, "#bulk-status", "complete", timeout=60)  # polled by htmx
    assert "5 done" in browser.find_element(By.CSS_SELECTOR, "#bulk-counts").text
    assert (
        stack.scalar(
            "SELECT count(*) FROM onceflow_instances"
            " WHERE status = 'terminated' AND job_id LIKE 'hold\\_%'"
        )
        == 5
    )

    # Re-drive the dead letter: the type is still unknown, so it is dead-lettered again.
    click(browser, "nav a[href='/dead-letters']")
    wait_text(browser, "#dead-letters", "unknown_type")
    shot(browser, "dead-letters")
    click(browser, "#dead-letters input[name=record]")
    click(browser, "#redrive-selected")
    wait_text(browser, "#confirm-count", "1")
    confirm(browser)
    wait_text(browser, "#redrive-result", "re-driven")
    stack.wait_for(
        lambda: len(dead_letters_for(stack.db, "ghost_0001")) == 2,
        60,
        "the re-driven record dead-lettered again",
    )

    assert _off_loopback(_requested_urls(browser), console_url) == []
