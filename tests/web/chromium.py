"""Debian's Chromium driven through ChromeDriver (selenium): headless, a WAV file as the microphone.

Chromium and ChromeDriver come from Debian (`make browser-deps`); ``MISSING`` says what is not installed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
MISSING = "" if CHROMIUM and CHROMEDRIVER else "chromium/chromedriver not installed (run `make browser-deps`)"


def chromium(mic: Path) -> Any:
    """A headless Chromium whose microphone plays ``mic`` once (then silence); quit it when done."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM or ""
    for flag in (
        "--headless",
        "--no-sandbox",
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        # %noloop: speak once, then silence, so a later barge-in is the test's and not the looping WAV's
        f"--use-file-for-fake-audio-capture={mic}%noloop",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-dev-shm-usage",
        "--window-size=1200,820",
        # the gateway's call answers with its 127.0.0.1 candidate, which Chromium ignores by default
        "--allow-loopback-in-peer-connection",
    ):
        opts.add_argument(flag)
    # An explicit driver path: selenium never tries to download one.
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER or ""))


class PageTimeout(AssertionError):
    """A page never reached a state; the message says which and what the page's state was."""


def wait_page(
    driver: Any, script: str, pred: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """Polls ``return <script>`` (the page's state object) until ``pred`` holds, or ``PageTimeout``."""
    deadline = time.monotonic() + timeout
    while True:
        state = driver.execute_script(f"return {script}")
        if state is not None and pred(state):
            return state
        if time.monotonic() > deadline:
            raise PageTimeout(f"page never reached: {what}; state: {state}")
        time.sleep(0.1)
