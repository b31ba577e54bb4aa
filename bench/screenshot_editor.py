"""Screenshot the notebook editor as a browser renders it: bench/results/editor.png.

Starts Voilà (which runs a notebook and renders its widgets without anyone pressing Run) on
127.0.0.1 with a free port, no browser and no token, on a small notebook that shows a
`LoopTreeEditor` on a matmul after a few moves (the last one illegal, so the status shows its
reason); drives headless Chromium through the DevTools protocol until the widgets are drawn;
saves a PNG; stops both.  Needs `pip install voila` and the Debian package chromium.

    python bench/screenshot_editor.py [--out bench/results/editor.png] [--width 1400]
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio"]

NOTEBOOK_CODE = '''
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
import looptool as lt
from looptool.notebook import LoopTreeEditor

rng = np.random.default_rng(0)
a_np = rng.standard_normal((128, 128), dtype=np.float32)
b_np = rng.standard_normal((128, 128), dtype=np.float32)
m, k, n = lt.symbols("m k n")
c = (lt.Tensor(a_np).to(m, k) * lt.Tensor(b_np).to(k, n)).sum(k)
editor = LoopTreeEditor(c, baseline=lambda: a_np @ b_np, name="matmul 128x128x128 as (a * b).sum(k)")
editor.split(32, "n"); editor.vectorize("n.1")
editor.split(4, "m"); editor.reorder("m.0", "k", "m.1"); editor.unroll("m.1")
editor.select("t0", "k")
editor.parallel()            # illegal: shows the reason, leaves the schedule unchanged
editor
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(folder: Path) -> Path:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    book = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                 "language": "python"}})
    book.cells.append(new_code_cell(NOTEBOOK_CODE.strip()))
    path = folder / "editor_demo.ipynb"
    nbformat.write(book, path)
    return path


def wait_port(port: int, timeout: float, proc: subprocess.Popen) -> None:
    """Wait until something listens on 127.0.0.1:port (without requesting a page)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:g} s")


def wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")


@contextlib.contextmanager
def started(cmd, log: Path, env=None, cwd=None):
    """Run a server in its own process group; stop that group (TERM, then KILL) on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)


class DevTools:
    """The least of the Chrome DevTools protocol: send a command, wait for its answer."""

    def __init__(self, ws_url: str):
        import websocket   # websocket-client, installed with jupyter_server
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def close(self):
        self.ws.close()


READY_JS = """(() => {
  const buttons = document.querySelectorAll('.widget-button, .jupyter-button').length;
  const pre = document.querySelector('.widget-html pre, .jupyter-widget-html pre');
  const img = document.querySelector('.widget-image, .jupyter-widget-image, img');
  return buttons >= 10 && pre !== null && img !== null && (img.complete === undefined || img.complete);
})()"""


def screenshot_devtools(chromium: str, url: str, out: Path, width: int, profile: Path, logs: Path,
                        timeout: float) -> None:
    port = free_port()
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
           "--remote-debugging-address=127.0.0.1", f"--window-size={width},1000", "about:blank"]
    with started(cmd, logs / "chromium.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/json/version", 60, proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            pages = [t for t in json.load(resp) if t.get("type") == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        try:
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=width, height=1000, deviceScaleFactor=1,
                       mobile=False)
            tools.call("Page.navigate", url=url)
            deadline = time.time() + timeout
            while not tools.evaluate(READY_JS):
                if time.time() > deadline:
                    text = tools.evaluate("document.body ? document.body.innerText.slice(0, 2000) : ''")
                    raise TimeoutError(f"the editor's widgets did not appear within {timeout:g} s; page text:\n"
                                       f"{text}")
                time.sleep(1.0)
            time.sleep(2.0)   # let the last images and fonts settle
            height = int(tools.evaluate("Math.ceil(Math.max(document.body.scrollHeight, "
                                        "document.documentElement.scrollHeight))") or 1000)
            height = min(max(height, 600), 4000)
            tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                       mobile=False)
            time.sleep(0.5)
            shot = tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            tools.close()


def screenshot_cli(chromium: str, url: str, out: Path, width: int, profile: Path, logs: Path) -> None:
    """Fallback without websocket-client: let virtual time run while Voilà renders the widgets."""
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},1400",
           "--virtual-time-budget=60000", f"--screenshot={out}", url]
    with open(logs / "chromium.log", "wb") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=180, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "editor.png"))
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the widgets")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("no chromium found: apt-get install chromium")
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="looptool-screenshot-") as tmp:
        tmp = Path(tmp)
        notebook = write_notebook(tmp)
        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "LOOPTOOL_TUNING_DB": str(tmp / "tuned.sqlite"), "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"),
               "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime")}
        voila = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}",
                 "--Voila.ip=127.0.0.1", "--Voila.open_browser=False"]
        url = f"http://127.0.0.1:{port}/"
        with started(voila, tmp / "voila.log", env=env, cwd=tmp) as server:
            try:
                wait_port(port, 120, server)   # Voilà runs the notebook when the page is visited
                if importlib.util.find_spec("websocket"):      # websocket-client drives Chromium's DevTools
                    screenshot_devtools(chromium, url, out, args.width, tmp / "chromium-profile", tmp, args.timeout)
                else:
                    screenshot_cli(chromium, url, out, args.width, tmp / "chromium-profile", tmp)
            except Exception:
                for log in ("voila.log", "chromium.log"):
                    if (tmp / log).exists():
                        sys.stderr.write(f"--- {log} (last 3000 characters)\n{(tmp / log).read_text()[-3000:]}\n")
                raise
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
