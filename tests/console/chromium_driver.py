"""A real Chromium (Debian's, driven through its chromedriver by Selenium) for the console's tests:
headless, with screenshots written under build/screenshots/ (not committed) for a reviewer."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

__all__ = ["SCREENSHOTS", "Chromium"]

SCREENSHOTS = Path(__file__).parents[2] / "build" / "screenshots"


class Chromium:
    """One headless Chromium window, and what the tests do with it."""

    def __init__(self, base: str, lang: str = "en-US") -> None:
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium and driver, "Debian's chromium and chromium-driver are missing: ./dev installs them"
        os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download a browser
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
            options.add_argument(arg)
        options.add_argument("--window-size=1366,1000")
        options.add_argument(f"--lang={lang}")
        options.add_experimental_option("prefs", {"intl.accept_languages": lang})
        self.driver = webdriver.Chrome(options=options, service=Service(driver))
        self.base = base
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    @property
    def path(self) -> str:
        return self.driver.current_url.removeprefix(self.base).split("?")[0]

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self) -> str:
        return self.find("body").text

    def fill(self, css: str, value: str) -> None:
        field = self.find(css)
        field.clear()
        field.send_keys(value)

    def wait_for(self, what, timeout: float = 60.0, every: float = 0.2):
        """Until `what()` gives something true (the page is not reloaded: what changes, changes live)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = what()
            except (NoSuchElementException, StaleElementReferenceException):
                last = None
            except WebDriverException as exc:  # an element found as a form's answer replaced the page
                if "does not belong to the document" not in str(exc):
                    raise
                last = None
            if last:
                return last
            time.sleep(every)
        self.shot("timed-out")
        raise AssertionError(f"waited {timeout} s; the page shows:\n{self.text()[:3000]}")

    def wait_text(self, words: str, timeout: float = 60.0) -> None:
        self.wait_for(lambda: words in self.text(), timeout)

    def shot(self, name: str) -> Path:
        """A screenshot of the whole page as it is now."""
        path = SCREENSHOTS / f"{name}.png"
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1366, max(1000, min(int(height), 6000)))
        self.driver.save_screenshot(str(path))
        return path

    def quit(self) -> None:
        self.driver.quit()
