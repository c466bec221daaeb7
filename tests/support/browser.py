"""A real browser for tests: Debian's headless Chromium, driven by Selenium through chromedriver.

:func:`chromium` finds ``chromium`` and ``chromedriver``, or installs Debian's ``chromium`` and
``chromium-driver`` with apt-get when it runs as root (one install at a time across test workers:
a lock file), as the benchmarks install nginx. Where neither works the test is skipped, but not in
CI (``CI`` set): there a browser test that cannot run fails.

:func:`browser` starts one with what a closed network needs (no background connections, no
component updates: without them Chromium keeps trying hosts it cannot reach) and a fresh profile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_PACKAGES = ("chromium", "chromium-driver")
_LOCK = "/tmp/aiosendfile-tests-apt.lock"


def _found() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def _cannot(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the browser test cannot run in CI: {why}")
    pytest.skip(why)


def chromium() -> tuple[str, str]:
    """(the browser's path, chromedriver's path): found, or installed as root with apt-get."""
    found = _found()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _cannot("needs chromium and chromedriver (apt-get install chromium chromium-driver, as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [
        "apt-get",
        "-o",
        "DPkg::Lock::Timeout=300",
        "install",
        "-y",
        "--no-install-recommends",
        *_PACKAGES,
    ]
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (another worker may be installing them)
        if _found() is None:
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:  # a stale package list: refresh it, then again
                subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
                done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                _cannot(f"apt-get install {' '.join(_PACKAGES)} failed: {done.stderr.strip()[-500:]}")
    found = _found()
    if found is None:
        _cannot("chromium or chromedriver still not found after apt-get install")
    assert found is not None
    return found


@contextlib.contextmanager
def browser(profile: Path, *, javascript: bool = True) -> Iterator[Any]:
    """A headless Chromium under Selenium (its ``WebDriver``), quit on the way out; *javascript*
    off: scripts never run in it (downloads: :func:`save_downloads_in`)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # (as root)
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        yield driver
    finally:
        driver.quit()


def save_downloads_in(driver: Any, folder: Path) -> None:
    """Have *driver*'s running browser save what it downloads in *folder*, without asking."""
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)})
