"""A page opened in headless Chromium the way a person opens it, for the report tests (issue 29):
Debian's `chromium` (installed by the test session when missing, as root), driven over the DevTools
protocol on a pipe (--remote-debugging-pipe: standard library only, no websocket, no driver
download). What it gives back: the window and page widths, every image's load state, the console's
errors and the page's own exceptions and failed loads, the text of the first screen, a screenshot."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed import system

BINARIES = {"chromium": "chromium"}

FIRST_SCREEN_TEXT = """(() => {
  const out = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const range = document.createRange(); range.selectNodeContents(n);
    const r = range.getBoundingClientRect();
    if (r.width > 0 && r.bottom > 0 && r.top < window.innerHeight && n.textContent.trim()) out.push(n.textContent.trim());
  }
  return out.join(' ');
})()"""
IMAGES = "[...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"


class BrowserUnavailable(system.Unavailable):
    """Chromium cannot be provided here (not installed and not root, no apt-get, it does not start)."""


@dataclass
class Rendered:
    window_width: int
    page_width: int
    images: list[dict]
    first_screen: str
    errors: list[str] = field(default_factory=list)
    screenshot: Path | None = None


def chromium() -> str:
    """The chromium binary, installed when missing (BrowserUnavailable when it cannot be)."""
    found = system.find_binary("chromium")
    if found is None:
        system.install_packages(["chromium"], BINARIES, timeout_s=900, error=BrowserUnavailable)
        found = system.find_binary("chromium")
    if found is None:
        raise BrowserUnavailable("no chromium binary after installing it")
    return found


class _Pipe:
    """The DevTools protocol over Chromium's pipe: JSON messages, each ended by a NUL byte."""

    def __init__(self, to_browser: int, from_browser: int):
        self.out, self.inp, self.buf, self.next_id = to_browser, from_browser, b"", 0
        self.events: list[dict] = []

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise BrowserUnavailable("chromium closed its pipe")
            self.buf += chunk
        message, self.buf = self.buf.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self.out, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._read(timeout)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            event = self._read(max(0.1, deadline - time.monotonic()))
            if event.get("method") == method:
                return event
            self.events.append(event)


def _errors(events: list[dict]) -> list[str]:
    """The console's errors, uncaught exceptions and failed loads among the events."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif e.get("method") == "Runtime.exceptionThrown":
            out.append("exception: " + p.get("exceptionDetails", {}).get("text", ""))
        elif e.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')}")
    return out


def render(page: Path, width: int = 1400, height: int = 900, screenshot: Path | None = None,
           binary: str | None = None) -> Rendered:
    """Open `page` in headless Chromium with a width x height window; what a person would see."""
    binary = binary or chromium()
    profile = Path(tempfile.mkdtemp(prefix="suite-chromium-"))
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()

    argv = [binary, "--headless=new", "--remote-debugging-pipe", "--no-first-run", "--no-default-browser-check",
            "--disable-gpu", "--disable-extensions", "--disable-background-networking", "--disable-sync",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", "--hide-scrollbars",
            *(["--no-sandbox"] if os.geteuid() == 0 else []), "about:blank"]
    # the browser reads commands on its fd 3 and writes answers on its fd 4
    moved = f"exec 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-; exec \"$@\""
    proc = subprocess.Popen(["bash", "-c", moved, "bash", *argv], pass_fds=(to_r, from_w),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_r)
    os.close(from_w)
    cdp = _Pipe(to_w, from_r)
    try:
        target = cdp.call("Target.createTarget", url="about:blank")["targetId"]
        session = cdp.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            cdp.call(f"{domain}.enable", session)
        cdp.call("Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1,
                 mobile=False)
        cdp.call("Page.navigate", session, url=page.resolve().as_uri())
        cdp.wait_for("Page.loadEventFired", timeout=120)

        def value(expression: str):
            return cdp.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"]["value"]

        rendered = Rendered(window_width=value("window.innerWidth"),
                            page_width=value("document.documentElement.scrollWidth"),
                            images=value(IMAGES), first_screen=value(FIRST_SCREEN_TEXT))
        if screenshot is not None:
            shot = cdp.call("Page.captureScreenshot", session, format="png")["data"]
            screenshot.write_bytes(base64.b64decode(shot))
            rendered.screenshot = screenshot
        time.sleep(0.2)                      # late console messages
        cdp.call("Runtime.evaluate", session, expression="1")
        rendered.errors = _errors(cdp.events)
        return rendered
    finally:
        try:
            cdp.call("Browser.close", timeout=10)
        except (OSError, TimeoutError, RuntimeError, BrowserUnavailable):
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_w)
        os.close(from_r)
        shutil.rmtree(profile, ignore_errors=True)
