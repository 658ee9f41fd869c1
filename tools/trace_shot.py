"""trace_shot: a PNG of one step of a trace page (`python minibpd.py ... --trace t.html`, see
docs/trace.md), taken by headless Chromium through Selenium; docs/trace_*.png come from it:

    python tools/trace_shot.py t.html docs/trace_pbest.png --step 1 --height 1900

Needs Chromium and its driver (Debian: `apt-get install -y chromium chromium-driver`) and
`pip install selenium`. tests/lab/test_trace.py drives the same browser (chrome()).
"""
import argparse
import os
import shutil
import sys
import tempfile

INSTALL = "apt-get install -y chromium chromium-driver && pip install selenium"
# As root (CI) Chromium needs --no-sandbox; the rest keep it from calling home or updating.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def browser_paths():
    """(Chromium, chromedriver) -> paths, or a FileNotFoundError naming INSTALL."""
    binary = next((p for p in ("/usr/lib/chromium/chromium", *map(shutil.which, (
        "chromium", "chromium-browser", "google-chrome"))) if p and os.path.isfile(p)), None)
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        raise FileNotFoundError(f"Chromium or chromedriver not found: {INSTALL}")
    return binary, driver


def chrome(profile, width=1320, height=1000):
    """A headless Chromium driven by Selenium, a fresh profile in the folder `profile`, its
    console and network events logged (driver.get_log("browser"), get_log("performance")).
    ImportError or FileNotFoundError when Selenium or Chromium is missing."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    binary, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS + (f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver))


def shot(page, out, step=1, width=1320, height=None):
    """Open the page, go to step `step` (1 = the first) with the next button, save a PNG of the
    page's top `height` pixels (default: all of it, at most 6000)."""
    from selenium.webdriver.common.by import By
    with tempfile.TemporaryDirectory() as profile:
        driver = chrome(profile, width)
        try:
            driver.get("file://" + os.path.abspath(page))
            for _ in range(step - 1):
                driver.find_element(By.ID, "next").click()
            full, frame = driver.execute_script("return [document.documentElement.scrollHeight, "
                                                "window.outerHeight - window.innerHeight]")
            driver.set_window_size(width, min(height or full, 6000) + frame)   # the page's height
            driver.save_screenshot(out)
        finally:
            driver.quit()
    small(out)


def small(png):
    """The PNG in a palette of 256 colours, where Pillow is installed: the page's few flat
    colours survive, and the file takes a third of the bytes (371 KB -> 120 KB for
    docs/trace_pbest.png)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as im:
        palette = im.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE)
    palette.save(png, optimize=True)


def main(argv=None):
    p = argparse.ArgumentParser(description="A PNG of one step of a minibpd trace page.")
    p.add_argument("page")
    p.add_argument("out")
    p.add_argument("--step", type=int, default=1)
    p.add_argument("--width", type=int, default=1320)
    p.add_argument("--height", type=int, default=None)
    args = p.parse_args(argv)
    try:
        shot(args.page, args.out, args.step, args.width, args.height)
    except (ImportError, FileNotFoundError) as e:
        print(f"error: {e} ({INSTALL})", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
