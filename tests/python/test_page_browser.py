"""The page on the box at `/`, in a real browser: Debian's `chromium`, headless, driven
through `chromium-driver` with selenium. The daemon reads the Orin NX fixture's sysfs tree
(`--board jetson-orin-nx-16gb --sysfs-root ...`) so temperatures and clocks show on a
machine without sensors.

Each test asserts that the browser logged no console error (SEVERE entries, which include
a failed load of any resource and every uncaught exception), that the page shows the model
id and a temperature, and that a chat message streams an answer into the page. With an API
key set, the page asks for the key and then works, keeping it only in memory.

Env: CHROMIUM_REQUIRE=1 (set by CI) turns a missing chromium or chromedriver from a skip
into a failure; CHROMIUM_BIN, CHROMEDRIVER_BIN (default: found on PATH); PAGE_SCREENSHOT_DIR
(default out/page): screenshot.png (no key) and screenshot-key.png (with a key).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterator

import pytest

from conftest import API_KEY, REPO, running_daemon

FIXTURE_SYS = REPO / "thermal/tests/fixtures/orin-nx-jp6/sys"
WAIT_S = 60.0
# A prompt that makes a 135M model write for all of MAX_TOKENS (greedy, so every run
# reads the same answer), so the answer streams for long enough to be seen growing.
PROMPT = "Write a short poem about the sea."
MAX_TOKENS = "48"
TEMPERATURE = re.compile(r"^\d+\.\d °C$")


def unavailable(reason: str):
    if os.environ.get("CHROMIUM_REQUIRE") == "1":
        pytest.fail(f"CHROMIUM_REQUIRE=1: {reason}")
    pytest.skip(reason)


def tool(env: str, *names: str) -> str:
    given = os.environ.get(env)
    if given:
        if not os.access(given, os.X_OK):
            unavailable(f"{env}={given} is not an executable")
        return given
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    unavailable(f"{names[0]} not found (apt-get install chromium chromium-driver, or set {env})")
    raise AssertionError("unreachable")


def screenshot_dir() -> Path:
    d = Path(os.environ.get("PAGE_SCREENSHOT_DIR") or REPO / "out/page")
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed in the venv (tests/python/requirements.txt)")
    chromium = tool("CHROMIUM_BIN", "chromium", "chromium-browser")
    chromedriver = tool("CHROMEDRIVER_BIN", "chromedriver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
    drv.set_page_load_timeout(WAIT_S)
    try:
        yield drv
    finally:
        drv.quit()


def board_daemon(*extra: str):
    return running_daemon("--board", "jetson-orin-nx-16gb", "--sysfs-root", str(FIXTURE_SYS),
                          "--thermal-interval-ms", "200", *extra)


@pytest.fixture(scope="module")
def board_url() -> Iterator[str]:
    with board_daemon() as url:
        yield url


@pytest.fixture(scope="module")
def keyed_board_url() -> Iterator[str]:
    with board_daemon("--api-key", API_KEY) as url:
        yield url


def wait_for(what: str, check, timeout: float = WAIT_S):
    from selenium.common.exceptions import StaleElementReferenceException
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except StaleElementReferenceException as e:
            # The page redraws its panels every refresh: an element found a moment ago may
            # be gone by the time it is read. Look again.
            last = e
        else:
            if last:
                return last
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def text(drv, css: str) -> str:
    """The text of the first element `css` selects, looked up again if a redraw replaced it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    for _ in range(20):
        try:
            els = drv.find_elements(By.CSS_SELECTOR, css)
            return els[0].text if els else ""
        except StaleElementReferenceException:
            time.sleep(0.05)
    pytest.fail(f"{css} was redrawn under every read")


def severe(drv) -> list[dict]:
    return [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def shows_box(drv, model_id: str) -> None:
    """The model id from /v1/status and a temperature from /metrics are on the page."""
    from selenium.webdriver.common.by import By
    wait_for("the model id", lambda: text(drv, "#model-id") == model_id)
    temps = wait_for("a temperature", lambda: [
        e.text for e in drv.find_elements(By.CSS_SELECTOR, "#temps td.temp")
        if TEMPERATURE.match(e.text)])
    assert "45.8 °C" in temps, temps  # the fixture's gpu-thermal zone
    # Trends: seeded from /v1/thermal's history, then one sample per refresh.
    wait_for("a temperature trend", lambda: drv.find_elements(By.CSS_SELECTOR, "#temps svg.spark polyline"))
    wait_for("a clock trend", lambda: drv.find_elements(By.CSS_SELECTOR, "#clocks svg.spark polyline"))
    assert text(drv, "#board").startswith("jetson-orin-nx-16gb"), text(drv, "#board")
    assert re.fullmatch(r"[0-9a-f]{64}|hashing…", text(drv, "#model-sha")), text(drv, "#model-sha")
    assert text(drv, "#thermal-state") == "normal"
    assert "of 2" in text(drv, "#slots"), text(drv, "#slots")


def chat_streams(drv) -> str:
    """Sends PROMPT and watches the answer grow in the page until the stream ends."""
    from selenium.webdriver.common.by import By
    drv.find_element(By.ID, "chat-max").clear()
    drv.find_element(By.ID, "chat-max").send_keys(MAX_TOKENS)
    drv.find_element(By.ID, "chat-temp").clear()
    drv.find_element(By.ID, "chat-temp").send_keys("0")
    drv.find_element(By.ID, "chat-input").send_keys(PROMPT)
    drv.find_element(By.ID, "chat-send").click()
    assert wait_for("the user's message", lambda: text(drv, ".msg.user")) == PROMPT
    partial = []

    def done() -> bool:
        streaming = drv.find_elements(By.CSS_SELECTOR, ".msg.assistant.streaming")
        if streaming:
            t = streaming[0].text
            if t and (not partial or partial[-1] != t):
                partial.append(t)
            return False
        return bool(drv.find_elements(By.CSS_SELECTOR, ".msg.assistant"))

    wait_for("the answer to finish streaming", done)
    answer = text(drv, ".msg.assistant")
    assert answer.strip(), f"empty answer; error: {text(drv, '#chat-error')!r}"
    assert text(drv, "#chat-error") == ""
    # Seen while it streamed: growing prefixes of the final answer, more than one.
    assert len(partial) >= 2, f"the answer did not grow in the page: {partial!r}"
    assert all(answer.startswith(p) for p in partial), (partial, answer)
    note = wait_for("the finish note", lambda: text(drv, ".msg.note"))
    assert re.search(rf"length · {MAX_TOKENS} tokens in", note), note
    return answer


def test_page_shows_the_box_and_streams_a_chat(driver, board_url, model_id):
    driver.get(board_url + "/")
    driver.get_log("browser")  # only this load's entries count below
    driver.refresh()
    assert driver.title == "InferLoop"
    shows_box(driver, model_id)
    assert not driver.find_element("id", "key-panel").is_displayed()
    chat_streams(driver)
    # The histograms catch up with the request on the next refresh.
    wait_for("the TTFT histogram", lambda: re.match(r"\d+ requests, mean", text(driver, "#ttft-hist .caption")))
    wait_for("the decode-speed histogram", lambda: "tok/s" in text(driver, "#speed-hist .caption"))
    driver.save_screenshot(str(screenshot_dir() / "screenshot.png"))
    errors = severe(driver)
    assert not errors, errors


def test_page_asks_for_the_key_and_keeps_it_in_memory(driver, keyed_board_url, model_id):
    from selenium.webdriver.common.by import By
    driver.get(keyed_board_url + "/")
    driver.get_log("browser")
    driver.refresh()
    panel = driver.find_element(By.ID, "key-panel")
    wait_for("the key panel", panel.is_displayed)
    # /metrics is public: temperatures show before the key; the model id does not.
    wait_for("a temperature", lambda: TEMPERATURE.match(text(driver, "#temps td.temp")))
    time.sleep(2.5)  # a refresh or more
    assert text(driver, "#model-id") == "–"
    assert not driver.find_element(By.ID, "chat-send").is_enabled()
    assert not severe(driver), "the page logged errors before any key was typed"

    # A wrong key: the box refuses it (the browser logs that 401) and the page asks again.
    driver.find_element(By.ID, "key-input").send_keys("not-the-key")
    driver.find_element(By.ID, "key-submit").click()
    wait_for("the refusal", lambda: "refused" in text(driver, "#key-error"))
    assert panel.is_displayed()
    refused = severe(driver)
    assert refused and all("401" in e["message"] for e in refused), refused

    driver.find_element(By.ID, "key-input").send_keys(API_KEY)
    driver.find_element(By.ID, "key-submit").click()
    shows_box(driver, model_id)
    assert not panel.is_displayed()
    chat_streams(driver)
    stored = driver.execute_script(
        "return [localStorage.length, sessionStorage.length, document.cookie]")
    assert stored == [0, 0, ""], stored
    assert API_KEY not in driver.page_source
    driver.save_screenshot(str(screenshot_dir() / "screenshot-key.png"))
    errors = severe(driver)
    assert not errors, errors
