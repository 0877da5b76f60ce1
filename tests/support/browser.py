"""Headless Chromium for the tests, driven through chromedriver (selenium): Debian's
``chromium`` and ``chromium-driver``, which ``scripts/setup-host.sh`` installs."""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _require() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: run `sudo bash scripts/setup-host.sh` "
            "(it installs Debian's chromium and chromium-driver)"
        )


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium session with a new, empty profile; its console log is kept."""
    _require()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="sparkbuild-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, page: Path, width: int = 1280) -> list[str]:
    """Load ``page`` from the file system at ``width`` CSS pixels; the console errors it
    logged (messages of level SEVERE: script errors, blocked content, failed loads)."""
    driver.get_log("browser")  # drop what an earlier page logged
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600},
    )
    driver.get(page.as_uri())
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver: Any, path: Path, width: int) -> Path:
    """The whole page at ``width`` (already loaded with :func:`open_page` at that width)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 16000), "scale": 1},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
