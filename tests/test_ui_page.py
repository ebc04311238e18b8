"""`specdec ui` in a real browser (issue 54): Debian's headless Chromium, driven by selenium through
Debian's chromedriver, opens the page that `specdec ui` serves on 127.0.0.1 (a free port, the
server stopped by its own pid), uploads a bundled sample and waits for the sentence. The oracle is
the command line: `specdec describe --trace --json` on the same file and preset prints the same
sentence, the same trace (each block's gate and where it went) and the same record. Skipped, with
the reason, where Chromium or its driver is not installed (`make browser` installs both on Debian).

The guide's screenshots come from the same page, from a real run:

    .venv/bin/python tests/test_ui_page.py --write    # docs/ui.png (desktop) and docs/ui-phone.png (390x844)
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECDEC = str(Path(sys.executable).with_name("specdec"))
SAMPLE = ROOT / "samples" / "f_mid_mid_loud.wav"
PRESET = "quality"
OPEN = re.compile(r"open (http://127\.0\.0\.1:\d+/)")
# The flags that run Chromium headless here: no GPU, no sandbox (root in a container), and none of
# its own traffic (updates, sync, QUIC), each run in a fresh profile.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
# The microphone, faked: the browser grants it without asking and plays this file into it.
FAKE_MIC = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"]
PHONE = (390, 844)  # an iPhone 12-15's viewport in CSS pixels


def chromium() -> tuple[str, str] | None:
    """(browser, driver) where both are installed (Debian: chromium, chromium-driver)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def env() -> dict[str, str]:
    out = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONIOENCODING": "utf-8"}
    out.pop("SPECDEC_DEBUG", None)
    return out


class UiServer:
    """`specdec --threads 1 ui --port 0 ARGS…` in a child process, its start line read for the URL."""

    def __init__(self, *args: str) -> None:
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.lines: list[str] = []

    def start(self, timeout: float = 300.0) -> UiServer:
        self.proc = subprocess.Popen([SPECDEC, "--threads", "1", "ui", "--port", "0", *self.args], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env())
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stderr] and None, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.lines.append(line)
            if m := OPEN.search(line):
                self.url = m.group(1)
                return self
        self.stop()
        raise RuntimeError(f"specdec ui did not start: {''.join(self.lines)}")

    def stop(self) -> int | None:
        """Ctrl-C by its own pid; SIGKILL if it has not ended in 60 s."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=30)


def as_phone(driver) -> None:
    """The viewport of a phone (PHONE, CSS pixels, touch, a mobile viewport), as Chromium's device
    toolbar sets it: a window's size would also count the window's own frame."""
    width, height = PHONE
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True})


def browser(profile: Path, size: tuple[int, int] = (1000, 900), mic: Path | None = None):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = chromium()
    assert found is not None
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={size[0]},{size[1]}")
    if mic is not None:
        options.add_argument(f"--use-file-for-fake-audio-capture={mic}")
        for flag in FAKE_MIC:
            options.add_argument(flag)
    # Debian's driver, named: selenium's own driver manager would try to download one.
    return webdriver.Chrome(service=Service(found[1]), options=options)


def wait(driver, condition, timeout: float = 180.0, what: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition, what)


def ready(driver, url: str, preset: str = PRESET) -> None:
    """The page open, its presets loaded and `preset` chosen."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(url)
    wait(driver, lambda d: d.find_element(By.ID, "preset").is_enabled(), 60, "the presets to load")
    Select(driver.find_element(By.ID, "preset")).select_by_value(preset)


def finished(driver) -> str | None:
    """'done' or 'error' once the page has ended its description."""
    state = driver.find_element("id", "sentence").get_attribute("data-state")
    return state if state in ("done", "error") else None


def upload(driver, path: Path) -> str:
    """Choose `path` in the page's file input and wait for the description to end: 'done' or 'error'."""
    driver.find_element("id", "file").send_keys(str(path))
    return wait(driver, finished, 180, "the description to end")


def page_trace(driver) -> list[tuple[str, str]]:
    """(gate, where it went) of each block the page drew, as its text reads."""
    return [(li.find_element("css selector", ".gate").text, li.find_element("css selector", ".went").text)
            for li in driver.find_elements("css selector", "#blocks > li")]


def cli_oracle(path: Path, preset: str = PRESET) -> tuple[dict, list[tuple[str, str]]]:
    """`specdec describe PATH --preset P --json --trace`: the record, and (gate, where) per trace line."""
    done = subprocess.run([SPECDEC, "--threads", "1", "describe", str(path), "--preset", preset, "--json",
                           "--trace"], capture_output=True, text=True, encoding="utf-8", env=env(), timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    trace = []
    for line in done.stderr.splitlines():  # "  1  ΣH 3.22 > 0.642  → cloud (entropy) 1/10  │ 说话 1.68✓ …"
        if m := re.match(r"\s*\d+\s{2}(\S+ [\d.]+ [>≤] \S+)\s{2,}(.+?)\s+│", line):
            trace.append((m.group(1), m.group(2).strip()))
    return json.loads(done.stdout), trace


needs_chromium = pytest.mark.skipif(chromium() is None, reason="no Chromium and chromedriver: on Debian `make "
                                    "browser` (apt-get install chromium chromium-driver) installs them")


@pytest.fixture(scope="module")
def server():
    if chromium() is None:
        pytest.skip("no Chromium and chromedriver: on Debian `make browser` (apt-get install chromium "
                    "chromium-driver) installs them")
    pytest.importorskip("selenium", reason="selenium is in the test extra: pip install -e '.[test]'")
    running = UiServer().start()
    yield running
    assert running.stop() == 0, "".join(running.lines)


@pytest.fixture(scope="module")
def oracle(server) -> tuple[dict, list[tuple[str, str]]]:
    """The command line's record and trace for the sample (one model load for the module's tests)."""
    return cli_oracle(SAMPLE)


@pytest.fixture
def driver(tmp_path):
    made = browser(tmp_path / "profile", mic=SAMPLE)
    yield made
    made.quit()


@needs_chromium
@pytest.mark.spawns
def test_an_uploaded_sample_gets_the_sentence_trace_and_record_of_specdec_describe(server, driver, oracle):
    record, trace = oracle
    ready(driver, server.url)
    assert upload(driver, SAMPLE) == "done", driver.find_element("id", "error").text
    assert driver.find_element("id", "sentence").text == record["description"]
    assert page_trace(driver) == trace and len(trace) >= 2
    # The record, as the page keeps it to copy: the same as --json's, but for the timings.
    shown = json.loads(driver.find_element("id", "record-json").get_attribute("data-line"))
    timings = {"latency_s", "tokens_per_s"}
    assert {k: v for k, v in shown.items() if k not in timings} == {k: v for k, v in record.items()
                                                                    if k not in timings | {"file"}} | \
        {"file": SAMPLE.name}
    # Each drafted token is drawn with its verdict: as many accepted as the record counts.
    accepted = driver.find_elements("css selector", "#blocks .tok.accepted")
    assert len(accepted) == record["accepted_tokens"] - _unverified(driver)
    assert not driver.find_element("id", "error").is_displayed()
    assert driver.find_element("id", "record-json").is_displayed()
    assert driver.find_element("id", "record").text == "● Record"  # the button, ready for another clip


def _unverified(driver) -> int:
    """Draft tokens kept on the edge unchecked: the record's accepted_tokens counts them too."""
    return len(driver.find_elements("css selector", "#blocks .tok.unverified"))


@needs_chromium
@pytest.mark.spawns
def test_a_file_that_is_not_audio_is_one_line_on_the_page_as_the_cli_says_it(server, driver, tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("this is not audio, just text with a .wav name\n" * 20)
    cli = subprocess.run([SPECDEC, "describe", str(bad)], capture_output=True, text=True, env=env(), timeout=120)
    assert cli.returncode == 2
    ready(driver, server.url)
    assert upload(driver, bad) == "error"
    error = driver.find_element("id", "error")
    assert error.is_displayed()
    assert error.text == cli.stderr.strip().replace(str(bad), bad.name)  # "error: cannot decode notes.wav as …"
    assert "Traceback" not in driver.page_source
    # Its error record is there to copy too, as `describe --json` would print it.
    assert json.loads(driver.find_element("id", "record-json").get_attribute("data-line"))["error_kind"] == "input"


@needs_chromium
@pytest.mark.spawns
def test_a_recording_from_the_microphone_is_described(server, driver):
    """The browser's microphone (faked: Chromium plays the sample into it) recorded with MediaRecorder
    as WebM/Opus, which the library decodes through PyAV like any upload."""
    from selenium.webdriver.common.by import By

    ready(driver, server.url)
    driver.find_element(By.ID, "record").click()
    wait(driver, lambda d: float((d.find_element(By.ID, "rec-time").text or "0 s").split()[0]) >= 3.0, 60,
         "3 s of recording")
    driver.find_element(By.ID, "record").click()
    state = wait(driver, finished, 180, "the recording's description")
    assert state == "done", driver.find_element(By.ID, "error").text
    record = json.loads(driver.find_element(By.ID, "record-json").get_attribute("data-line"))
    assert record["file"] == "recording.webm"
    assert 2.5 <= record["audio_s"] <= 30 and record["description"]
    assert driver.find_element(By.ID, "sentence").text == record["description"]


@needs_chromium
@pytest.mark.spawns
def test_on_a_phone_sized_window_nothing_is_wider_than_the_screen(server, tmp_path):
    phone = browser(tmp_path / "phone", size=PHONE)
    try:
        as_phone(phone)
        ready(phone, server.url)
        assert upload(phone, SAMPLE) == "done"
        width = phone.execute_script("return window.innerWidth")
        assert phone.execute_script("return document.documentElement.scrollWidth") <= width
        for element in ("preset", "record", "sentence", "blocks", "record-card"):
            box = phone.execute_script(f"return document.getElementById('{element}').getBoundingClientRect().right")
            assert box <= width, element
    finally:
        phone.quit()


@needs_chromium
@pytest.mark.spawns
def test_two_clips_at_once_take_turns_and_both_get_their_sentence(server, oracle):
    """The Pair describes one clip at a time: a request that comes while another decodes waits its
    turn, says so, and then gets the same sentence."""
    import httpx

    record, _ = oracle
    results: dict[str, list[dict]] = {}
    first_started = threading.Event()

    def one(key: str) -> None:
        lines = []
        with httpx.Client(timeout=300) as client, client.stream(
                "POST", f"{server.url}api/describe", params={"preset": PRESET, "name": SAMPLE.name},
                content=SAMPLE.read_bytes()) as answer:
            for line in answer.iter_lines():
                if line.strip():
                    lines.append(json.loads(line))
                    first_started.set()
        results[key] = lines

    first = threading.Thread(target=one, args=("first",))
    first.start()
    assert first_started.wait(120)  # the first clip holds the pair: its start line has come
    second = threading.Thread(target=one, args=("second",))
    second.start()
    first.join(timeout=300)
    second.join(timeout=300)
    assert [results[k][-1]["sentence"] for k in ("first", "second")] == [record["description"]] * 2
    assert results["first"][0]["type"] == "start"
    assert [e["type"] for e in results["second"][:2]] == ["wait", "start"]


# -- the guide's screenshots ---------------------------------------------------------------------------

def screenshots(out: Path = ROOT / "docs") -> list[Path]:
    """The page after describing the sample, from a real server and browser: docs/ui.png (a desktop
    window, the whole page) and, on a phone's screen (PHONE), docs/ui-phone.png (what it shows
    first) and docs/ui-phone-trace.png (scrolled to the trace)."""
    if chromium() is None:
        sys.exit("no Chromium and chromedriver: apt-get install chromium chromium-driver (make browser)")
    if not _fonts():
        sys.exit("no font with Chinese characters: apt-get install fonts-wqy-microhei (the page would show boxes)")
    running = UiServer().start()
    written = []
    try:
        for phone in (False, True):
            with tempfile.TemporaryDirectory() as profile:
                driver = browser(Path(profile), size=PHONE if phone else (1000, 900))
                try:
                    if phone:
                        as_phone(driver)
                    ready(driver, running.url)
                    assert upload(driver, SAMPLE) == "done"
                    driver.execute_script("document.activeElement.blur()")
                    if phone:
                        written.append(out / "ui-phone.png")
                        driver.save_screenshot(str(written[-1]))
                        driver.execute_script("document.getElementById('result').scrollIntoView()")
                        written.append(out / "ui-phone-trace.png")
                    else:  # the whole page: the window as tall as the page (plus the window's own frame)
                        inner = driver.execute_script("return window.innerHeight")
                        outer = driver.get_window_size()["height"]
                        height = driver.execute_script("return document.documentElement.scrollHeight")
                        driver.set_window_size(1000, height + outer - inner)
                        written.append(out / "ui.png")
                    driver.save_screenshot(str(written[-1]))
                finally:
                    driver.quit()
    finally:
        running.stop()
    return written


def _fonts() -> list[str]:
    try:
        return subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return []


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_ui_page.py --write")
    for written in screenshots():
        print(written.relative_to(ROOT))
