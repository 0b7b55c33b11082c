"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol: open a page, wait
until a JavaScript condition holds, click, dump the DOM, take a screenshot. One browser process
serves every page of a test; ``websocket-client`` speaks the protocol."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from itertools import count
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Dagster's metadata table shows a Markdown value as a "[Show Markdown]" link in its row; clicking
# it opens the rendered Markdown (a dialog). True once the row labelled LABEL is on the page (its
# link clicked if it has one), false before.
SHOW_MARKDOWN = """(() => {
  const row = [...document.querySelectorAll('tr')]
    .find(r => r.cells.length && r.cells[0].innerText.trim() === LABEL);
  if (!row) return false;
  const link = [...row.querySelectorAll('*')]
    .find(e => e.childElementCount === 0 && e.textContent.trim() === '[Show Markdown]');
  if (link) link.click();
  return true;
})()"""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


class Browser:
    def __init__(self, user_data: Path, width: int = 1600, height: int = 1000) -> None:
        assert CHROMIUM is not None
        # Chromium's own temporary folders (its profile's singleton socket, org.chromium.Chromium.*)
        # go to TMPDIR: a short folder of this browser's, removed with it, where /tmp kept one per
        # browser that was terminated (a socket's path must stay under 108 bytes: not the test's).
        self.tmp = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={user_data}", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": self.tmp},
        )
        try:
            self._connect()
        except BaseException:
            self._stop()
            raise

    def _connect(self) -> None:
        """The DevTools port the browser printed, and a connection to its page."""
        import websocket

        assert self.proc.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(m.group(1)) if m else None
        assert port, "chromium did not open its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.ids = count(1)
        self.send("Page.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def eval(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"not true after {timeout}s: {expression}")

    def show_markdown(self, label: str, timeout: float = 60) -> None:
        """Wait for the metadata row ``label`` and click its "[Show Markdown]" (``SHOW_MARKDOWN``)."""
        self.wait_for(SHOW_MARKDOWN.replace("LABEL", json.dumps(label)), timeout=timeout)

    def dom(self) -> str:
        return str(self.eval("document.documentElement.outerHTML"))

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self._stop()

    def _stop(self) -> None:
        """The browser process ended, and its temporary folder removed."""
        try:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
