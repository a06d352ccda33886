"""A JupyterLab (or Notebook 7) server and a headless Chromium, for running notebooks through the real UI.

:class:`LabServer` starts ``jupyter lab`` from this interpreter's environment on
127.0.0.1 (a free port, a random token, an isolated config/runtime/kernel-spec
directory, so the kernel is this environment's ipykernel) and stops it by its
own process group. :class:`NotebookDriver` opens a notebook in a JupyterLab
page, runs all its cells with the ``notebook:run-all-cells`` command, waits for
the end and reports what a reader would see: error outputs, widgets that did
not render, kernel restarts. With ``app="notebook"`` the server is Notebook 7
(``python -m notebook``, built on JupyterLab's components) and the driver opens
each notebook in its own ``/notebooks/<path>`` page instead.

Nothing here needs the network, and nothing downloads a browser: Chromium is
the system's (``/usr/bin/chromium``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "SCREENSHOTS",
    "SKIPPED",
    "TUTORIALS",
    "tutorial_bytes",
    "CHROMIUM_ARGS",
    "LabServer",
    "NotebookDriver",
    "RunReport",
    "find_chromium",
    "find_code_cell",
    "find_widget_output",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = REPO / "tutorials"
SCREENSHOTS = REPO / "build" / "browser-screenshots"  # build/ is git-ignored
SKIPPED = "REAL-BROWSER TUTORIAL CHECK SKIPPED"

#: the flags Chromium is started with (Playwright adds its own automation flags)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

#: the kernel statuses that mean the kernel died or was restarted
BAD_KERNEL_STATUSES = ("restarting", "autorestarting", "dead", "terminating")

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

#: page text shown by ipywidgets / JupyterLab when a widget could not be displayed
WIDGET_ERROR_TEXTS = ("Click to show javascript error", "Error displaying widget")


def find_chromium() -> str | None:
    """The system Chromium: ``/usr/bin/chromium`` or ``chromium`` on the PATH, else ``None``."""
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def tutorial_bytes() -> dict[str, bytes]:
    """The checkout's tutorials, ``{file name: bytes}``."""
    return {p.name: p.read_bytes() for p in sorted(TUTORIALS.glob("*.ipynb"))}


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something truthy; raise ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """``jupyter lab`` serving ``root_dir``, with a kernel spec pointing at ``python``.

    Args:
        root_dir: the directory served (the notebooks' copy).
        work_dir: where config, runtime files, kernel spec and the log go.
        python: the interpreter that runs both the server and the kernel.
        startup_timeout: seconds to wait for ``/api/status``.
        app: ``"lab"`` (``jupyter lab``) or ``"notebook"`` (Notebook 7, ``python -m notebook``).
    """

    def __init__(
        self,
        root_dir: Path,
        work_dir: Path,
        python: str = sys.executable,
        startup_timeout: float = 120.0,
        app: str = "lab",
    ) -> None:
        if app not in ("lab", "notebook"):
            raise ValueError(f"app must be 'lab' or 'notebook', not {app!r}")
        self.app = app
        self.root_dir = Path(root_dir)
        self.work_dir = Path(work_dir)
        self.python = python
        self.startup_timeout = startup_timeout
        self.token = secrets.token_hex(24)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._log: Any = None
        self.log_path = self.work_dir / f"jupyter-{app}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _environment(self) -> dict[str, str]:
        w = self.work_dir
        kernel_dir = w / "jupyter-path" / "kernels" / "python3"
        kernel_dir.mkdir(parents=True, exist_ok=True)
        (kernel_dir / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [self.python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "Python 3 (ipykernel)",
                    "language": "python",
                }
            )
        )
        # Every notebook cell is rendered (no virtual scrolling): widgets below the fold are
        # created and checked, and the screenshot shows the whole notebook.
        settings = w / "config" / "lab" / "user-settings" / "@jupyterlab"
        (settings / "notebook-extension").mkdir(parents=True, exist_ok=True)
        (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
            json.dumps({"windowingMode": "none"})
        )
        (settings / "apputils-extension").mkdir(parents=True, exist_ok=True)
        (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "JPY_"))}
        env.update(
            JUPYTER_CONFIG_DIR=str(w / "config"),
            JUPYTER_DATA_DIR=str(w / "data"),
            JUPYTER_RUNTIME_DIR=str(w / "runtime"),
            JUPYTER_PATH=str(w / "jupyter-path"),
            JUPYTERLAB_SETTINGS_DIR=str(w / "config" / "lab" / "user-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(w / "config" / "lab" / "workspaces"),
            IPYTHONDIR=str(w / "ipython"),
            PYTHONUNBUFFERED="1",
        )
        return env

    def start(self) -> None:
        """Start the server and wait until ``/api/status`` answers."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the server process (returns at once; see :meth:`wait_ready`)."""
        self.port = _free_port()
        cmd = [
            self.python,
            "-m",
            "jupyterlab" if self.app == "lab" else "notebook",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            "--KernelSpecManager.ensure_native_kernel=False",
            "--ServerApp.terminals_enabled=False",
        ]
        if self.app == "lab":
            cmd += [
                "--LabApp.expose_app_in_browser=True",
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
            ]
        else:
            cmd.append("--JupyterNotebookApp.expose_app_in_browser=True")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = self._environment()
        self._log = open(self.log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        """Wait until ``/api/status`` answers (raise with the server's log if it exits or times out)."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter {self.app} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return self.api("status") is not None
            except (OSError, urllib.error.URLError):
                return False

        try:
            wait_for(ready, self.startup_timeout, f"jupyter {self.app}'s /api/status", interval=0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.log_tail()}") from None

    def api(self, path: str, method: str = "GET", timeout: float = 10.0) -> Any:
        """Call the REST API (``/api/<path>``) with the token; the decoded JSON (or ``None``)."""
        req = urllib.request.Request(
            f"{self.url}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def lab_url(self) -> str:
        return f"{self.url}/lab?token={self.token}"

    def notebook_url(self, path: str) -> str:
        """Notebook 7's page for the notebook at ``path`` (relative to the root)."""
        return f"{self.url}/notebooks/{urllib.parse.quote(path)}?token={self.token}"

    def shutdown_kernels(self) -> None:
        """Shut down every kernel through the API (best effort)."""
        try:
            for kernel in self.api("kernels") or []:
                self.api(f"kernels/{kernel['id']}", method="DELETE", timeout=30)
        except (OSError, urllib.error.URLError, ValueError):
            pass

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the kernels down, then SIGTERM the server's process group; SIGKILL on timeout."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self.shutdown_kernels()
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)  # the server's own group (start_new_session)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # anything left in the group (the server is its leader; its pid is the group id)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- jupyter {self.app} log (tail) ---\n" + text[-chars:]


# -- the page side ---------------------------------------------------------------------------
# Installed once per page; everything lives in window.__dpnb.
_PAGE_SETUP = r"""
() => {
  if (window.__dpnb) return true;
  const app = window.jupyterapp;
  if (!app) return false;
  // page.evaluate waits for a promise without a limit: give every wait in here one
  const limit = (promise, ms, what) => Promise.race([promise, new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`timed out after ${ms / 1000} s: ${what}`)), ms))]);
  window.__dpnb = {
    panel: null, log: [], run: null,
    open(path) { return limit(this._open(path), 120000, `opening ${path === null ? 'the page\'s notebook' : path}`); },
    // shut the kernel down and let the page go without a "leave the page?" prompt (Notebook 7)
    async release() {
      if (!this.panel) return true;
      try { this.panel.context.model.dirty = false; } catch (e) {}
      try { await limit(this.panel.sessionContext.shutdown(), 30000, 'the kernel to shut down'); } catch (e) {}
      return true;
    },
    async _open(path) {
      await app.restored;
      let panel = null;
      if (path === null) {
        // Notebook 7: the page shows one notebook; wait for its panel
        while (!(panel = Array.from(app.shell.widgets('main')).find(w => w.sessionContext && w.content))) {
          await new Promise(r => setTimeout(r, 100));
        }
        this.log = []; this.run = null;
      } else {
        // one notebook at a time: close (without asking) whatever is open
        for (const w of Array.from(app.shell.widgets('main'))) {
          if (w.sessionContext) { try { await w.sessionContext.shutdown(); } catch (e) {} }
          w.dispose();
        }
        this.log = []; this.run = null;
        panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
      }
      this.panel = panel;
      const sc = panel.sessionContext;
      const stamp = () => Math.round(performance.now());
      this.log.push({t: stamp(), what: 'opened', status: sc.session && sc.session.kernel ? sc.session.kernel.status : null});
      sc.statusChanged.connect((_, status) => this.log.push({t: stamp(), what: 'status', status}));
      sc.kernelChanged.connect((_, change) => this.log.push({
        t: stamp(), what: 'kernel', status: change.newValue ? change.newValue.id : null,
      }));
      sc.connectionStatusChanged.connect((_, status) => this.log.push({t: stamp(), what: 'connection', status}));
      await panel.context.ready;
      await sc.ready;
      app.shell.activateById(panel.id);
      return true;
    },
    kernelState() {
      const sc = this.panel.sessionContext;
      const k = sc.session && sc.session.kernel;
      return {status: k ? k.status : null, id: k ? k.id : null, name: k ? k.name : null,
              connection: k ? k.connectionStatus : null};
    },
    runAll() {
      const run = {done: false, result: null, error: null, started: performance.now()};
      this.run = run;
      this.log.push({t: Math.round(performance.now()), what: 'run-all', status: null});
      app.commands.execute('notebook:run-all-cells').then(
        r => { run.done = true; run.result = r === undefined ? null : r; },
        e => { run.done = true; run.error = String(e && e.stack || e); });
      return true;
    },
    progress() {
      const cells = [];
      const content = this.panel.content;
      content.widgets.forEach((cell, i) => {
        const m = cell.model;
        if (m.type !== 'code') return;
        cells.push({index: i, count: m.executionCount, state: m.executionState,
                    empty: m.sharedModel.getSource().trim() === ''});
      });
      return {run: this.run, kernel: this.kernelState(), cells};
    },
    notebook() { return this.panel.context.model.toJSON(); },
    // run code on the notebook's kernel without touching the notebook; its stdout
    async kernelEval(code) {
      const kernel = this.panel.sessionContext.session.kernel;
      const future = kernel.requestExecute({code, silent: false, store_history: false});
      let text = '';
      future.onIOPub = msg => { if (msg.header.msg_type === 'stream') text += msg.content.text; };
      await limit(future.done, 30000, 'a request to the kernel');
      return text;
    },
    // where each output of each code cell is in the page, and what it shows
    renderedOutputs() {
      const out = [];
      this.panel.content.widgets.forEach((cell, i) => {
        if (cell.model.type !== 'code') return;
        cell.node.setAttribute('data-dpnb-cell', String(i));
        cell.outputArea.widgets.forEach((child, j) => {
          const node = child.node;
          const r = node.getBoundingClientRect();
          const zero = el => { const b = el.getBoundingClientRect(); return b.width < 1 || b.height < 1; };
          out.push({
            cell: i, index: j, text: node.innerText.slice(0, 2000), width: r.width, height: r.height,
            widgets: node.querySelectorAll('.jupyter-widgets').length,
            // an ipympl figure whose canvas never got a size, an image that failed to load
            emptyCanvases: Array.from(node.querySelectorAll('.jupyter-matplotlib-canvas-div')).filter(zero).length,
            brokenImages: Array.from(node.querySelectorAll('img')).filter(
              im => im.complete && im.naturalWidth === 0).length,
          });
        });
      });
      return out;
    },
    // the element that scrolls the notebook, and its full height
    scroller() {
      const n = this.panel.content.node;
      return n.querySelector('.jp-WindowedPanel-outer') || n;
    },
    toTop() {
      this.panel.content.activeCellIndex = 0;
      this.panel.content.mode = 'command';
      this.scroller().scrollTop = 0;
    },
    fullHeight() {
      // the height the notebook needs down to its last cell (without the scroll-past-end space)
      const s = this.scroller();
      const cells = s.querySelectorAll('.jp-Cell');
      const last = cells.length ? cells[cells.length - 1] : null;
      const needed = last ? last.getBoundingClientRect().bottom - s.getBoundingClientRect().top + s.scrollTop + 24
                          : s.scrollHeight;
      return {needed: Math.ceil(needed), client: s.clientHeight};
    },
    dialogs() {
      return Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText.slice(0, 500));
    },
    closeDialogs() {
      document.querySelectorAll('.jp-Dialog .jp-mod-reject, .jp-Dialog .jp-Dialog-close-button, .jp-Dialog .jp-mod-accept')
        .forEach(b => b.click());
    },
    // tag the largest figure (image or ipympl canvas) and the controls of one output, for Playwright
    tagExplorer(cellIndex) {
      const cell = this.panel.content.widgets[cellIndex];
      cell.node.setAttribute('data-dpnb-cell', String(cellIndex));
      const root = cell.outputArea.node;
      const figures = Array.from(root.querySelectorAll('img, .jupyter-matplotlib-canvas-div'));
      let best = null, area = 0;
      for (const f of figures) {
        const b = f.getBoundingClientRect();
        if (b.width * b.height > area) { best = f; area = b.width * b.height; }
      }
      if (best) best.setAttribute('data-dpnb-figure', '1');
      return {figures: figures.length, area,
              sliders: root.querySelectorAll('.widget-slider .noUi-handle').length};
    },
  };
  return true;
}
"""


@dataclass
class RunReport:
    """What running one notebook in the browser showed; :attr:`problems` empty means all is well."""

    name: str
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    widget_problems: list[str] = field(default_factory=list)
    kernel_problems: list[str] = field(default_factory=list)
    unexecuted: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    kernel_log: list[dict] = field(default_factory=list)
    notebook: dict = field(default_factory=dict)
    kernel_prefix: str = ""

    @property
    def problems(self) -> list[str]:
        out = [f"error output in {e}" for e in self.errors]
        out += [f"widget: {w}" for w in self.widget_problems]
        out += [f"kernel: {k}" for k in self.kernel_problems]
        out += [f"not executed: {c}" for c in self.unexecuted]
        return out

    def explain(self) -> str:
        """The problems, then what else the page said (for the failure message)."""
        lines = [f"{self.name}: {len(self.problems)} problem(s) in the browser run:"]
        lines += [f"  - {p}" for p in self.problems]
        if self.page_errors:
            lines.append("uncaught errors in the page (for information):")
            lines += [f"  ! {e[:300]}" for e in self.page_errors[:10]]
        statuses = [e["status"] for e in self.kernel_log if e["what"] == "status"]
        lines.append(f"kernel statuses: {' > '.join(map(str, statuses))[-600:]}")
        return "\n".join(lines)


_LIVE_WIDGETS = """
import json as _j, sys as _s
_w = _s.modules.get("ipywidgets.widgets.widget")
print(_j.dumps(sorted(getattr(_w, "_instances", {})) if _w else []), end="")
del _j, _s, _w
"""


def _cell_label(nb: dict, index: int) -> str:
    source = "".join(nb["cells"][index].get("source", ""))
    first = next((line for line in source.splitlines() if line.strip()), "")
    return f"cell {index} ({first[:60]!r})"


def find_code_cell(nb: dict, needle: str) -> int | None:
    """The index of the first code cell whose source contains ``needle``."""
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") == "code" and needle in "".join(cell.get("source", "")):
            return i
    return None


def find_widget_output(nb: dict, needle: str) -> int | None:
    """The first cell showing a widget, from the first code cell whose source contains ``needle`` on
    (an explorer made in one cell may be shown in a later one)."""
    start = find_code_cell(nb, needle)
    if start is None:
        return None
    for i in range(start, len(nb["cells"])):
        if any(WIDGET_MIME in out.get("data", {}) for out in nb["cells"][i].get("outputs", [])):
            return i
    return None


class NotebookDriver:
    """Runs notebooks, one after the other, in one JupyterLab page (a Playwright ``Page``).

    With a Notebook 7 server (``server.app == "notebook"``) each notebook gets its own
    ``/notebooks/<path>`` page, loaded in the same Playwright ``Page``.

    Args:
        page: a page of the browser.
        server: the running :class:`LabServer`.
    """

    def __init__(self, page: Any, server: LabServer) -> None:
        self.page = page
        self.server = server
        self.page_errors: list[str] = []
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))
        self._loaded = False

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    @property
    def notebook7(self) -> bool:
        return getattr(self.server, "app", "lab") == "notebook"

    def load(self, timeout: float = 120.0) -> None:
        """Load JupyterLab and install the page helpers (once); Notebook 7 loads a page per notebook."""
        if self.notebook7:
            self._loaded = True
            return
        self.page.goto(self.server.lab_url(), wait_until="domcontentloaded", timeout=timeout * 1000)
        wait_for(lambda: self.js(_PAGE_SETUP), timeout, "JupyterLab (window.jupyterapp)", 0.25)
        self.js("""() => Promise.race([window.jupyterapp.restored, new Promise((_, reject) =>
            setTimeout(() => reject(new Error('JupyterLab did not finish restoring in 120 s')), 120000))])""")
        # the single-document interface with the side bars closed: the screenshot is the notebook
        self.js("""() => {
            const app = window.jupyterapp;
            app.shell.mode = 'single-document';
            app.shell.collapseLeft(); app.shell.collapseRight();
        }""")
        self._loaded = True

    def open(self, path: str, timeout: float = 120.0) -> None:
        """Open ``path`` (closing the notebook before it) and wait for its kernel to be idle."""
        if not self._loaded:
            self.load()
        if self.notebook7:
            self._open_notebook7(path, timeout)
        else:
            self.js("() => window.__dpnb.closeDialogs()")
            self.js("p => window.__dpnb.open(p)", path)
        wait_for(
            lambda: self.js("() => window.__dpnb.kernelState().status") == "idle",
            timeout,
            f"the kernel of {path} to be idle",
        )

    def _open_notebook7(self, path: str, timeout: float) -> None:
        """Load Notebook 7's page for ``path`` (after shutting the previous one's kernel down)."""
        if self.page.url.startswith(self.server.url):
            self.js("() => window.__dpnb ? window.__dpnb.release() : true")
        self.page.goto(self.server.notebook_url(path), wait_until="domcontentloaded", timeout=timeout * 1000)
        wait_for(lambda: self.js(_PAGE_SETUP), timeout, "Notebook 7 (window.jupyterapp)", 0.25)
        self.js("() => window.__dpnb.open(null)")

    def kernel_eval(self, code: str) -> str:
        """What ``code`` prints on the notebook's kernel (run without touching the notebook)."""
        return self.js("code => window.__dpnb.kernelEval(code)", code)

    def kernel_prefix(self) -> str:
        """``sys.prefix`` of the notebook's kernel."""
        return self.kernel_eval('import sys; print(sys.prefix, end="")')

    def live_widget_ids(self) -> set[str] | None:
        """The ids of the widgets still open in the kernel (``None`` if it cannot say)."""
        try:
            text = self.kernel_eval(_LIVE_WIDGETS)
            return set(json.loads(text))
        except Exception:  # noqa: BLE001 - a dead kernel is reported elsewhere
            return None

    def run_all(self, name: str, timeout: float = 240.0, widget_timeout: float = 30.0) -> RunReport:
        """Open ``name``, run all cells through the UI, wait for the end; a :class:`RunReport`."""
        report = RunReport(name)
        errors_before = len(self.page_errors)
        t0 = time.monotonic()
        self.open(name)
        report.kernel_prefix = self.kernel_prefix()
        self.js("() => window.__dpnb.runAll()")

        def finished() -> dict | None:
            p = self.js("() => window.__dpnb.progress()")
            done = p["run"]["done"] and p["kernel"]["status"] == "idle"
            if p["kernel"]["status"] in ("dead", None) or self.js("() => window.__dpnb.dialogs()"):
                done = True  # nothing more will happen; the report says why
            return p if done and not any(c["state"] == "running" for c in p["cells"]) else None

        try:
            progress = wait_for(finished, timeout, f"all cells of {name} to run", interval=0.25)
        except TimeoutError as exc:
            p = self.js("() => window.__dpnb.progress()")
            pending = [c["index"] for c in p["cells"] if c["state"] == "running" or c["count"] is None]
            raise TimeoutError(f"{exc}; kernel {p['kernel']}; code cells not finished: {pending}") from None
        report.seconds = time.monotonic() - t0
        if progress["run"]["error"]:
            report.kernel_problems.append(f"run-all-cells failed: {progress['run']['error']}")
        nb = report.notebook = self.js("() => window.__dpnb.notebook()")
        report.unexecuted = [
            _cell_label(nb, c["index"]) for c in progress["cells"] if c["count"] is None and not c["empty"]
        ]
        for i, cell in enumerate(nb["cells"]):
            if "raises-exception" in cell.get("metadata", {}).get("tags", []):
                continue  # an error on purpose (JupyterLab runs on past it, nbval checks it raises)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    report.errors.append(f"{_cell_label(nb, i)}: {out.get('ename')}: {out.get('evalue')}")
        self._check_widgets(nb, report, widget_timeout)
        self._check_kernel(report)
        report.page_errors = self.page_errors[errors_before:]
        return report

    def _check_kernel(self, report: RunReport) -> None:
        log = report.kernel_log = self.js("() => window.__dpnb.log")
        run_at = next((e["t"] for e in log if e["what"] == "run-all"), 0)
        for entry in log:
            if entry["what"] == "status" and entry["status"] in BAD_KERNEL_STATUSES:
                report.kernel_problems.append(f"kernel status {entry['status']!r} (died or restarted)")
            elif entry["t"] >= run_at and entry["what"] == "kernel":
                report.kernel_problems.append(f"kernel replaced while running (new id {entry['status']})")
            elif entry["t"] >= run_at and entry["what"] == "status" and entry["status"] == "starting":
                report.kernel_problems.append("kernel started again while running (a restart)")
        # widgets talk to the kernel after the cells ran (an ipympl canvas asks for its draws):
        # busy for a moment then is fine, busy for good is not
        state = "() => window.__dpnb.kernelState()"
        try:
            final = wait_for(
                lambda: (k := self.js(state))["status"] != "busy" and k, 15, "the kernel to be idle", interval=0.25
            )
        except TimeoutError:
            final = self.js(state)
        if final["status"] != "idle" or final["connection"] != "connected":
            report.kernel_problems.append(f"kernel at the end: {final}")
        for text in self.js("() => window.__dpnb.dialogs()"):
            report.kernel_problems.append(f"a dialog is open: {' '.join(text.split())!r}")

    def _check_widgets(self, nb: dict, report: RunReport, timeout: float) -> None:
        """Every widget output shows a rendered widget; no widget error text on the page."""
        expected = [
            (i, j)
            for i, cell in enumerate(nb["cells"])
            for j, out in enumerate(cell.get("outputs", []))
            if WIDGET_MIME in out.get("data", {})
        ]
        # a widget the code closed (a finished tqdm bar with leave=False) leaves an empty output: fine
        live = self.live_widget_ids() if expected else set()
        if live is not None:
            expected = [
                (i, j) for i, j in expected if nb["cells"][i]["outputs"][j]["data"][WIDGET_MIME].get("model_id") in live
            ]

        def problems() -> list[str]:
            found = []
            text = self.page.inner_text("body")
            found += [f"the page shows {t!r}" for t in WIDGET_ERROR_TEXTS if t in text]
            rendered = {(o["cell"], o["index"]): o for o in self.js("() => window.__dpnb.renderedOutputs()")}
            for key in expected:
                o = rendered.get(key)
                where = _cell_label(nb, key[0])
                if o is None or o["widgets"] == 0:
                    shown = (o or {}).get("text", "<no output node>")
                    found.append(f"{where}: widget not rendered (the output shows {shown[:200]!r})")
                elif o["width"] < 1 or o["height"] < 1:
                    found.append(f"{where}: widget rendered with zero size")
                elif o["emptyCanvases"]:
                    found.append(f"{where}: {o['emptyCanvases']} ipympl figure(s) with a zero-size canvas (not drawn)")
            for o in rendered.values():
                if o["brokenImages"]:
                    found.append(f"{_cell_label(nb, o['cell'])}: {o['brokenImages']} image(s) failed to load")
            return found

        # widgets render asynchronously after their output arrives: wait for a clean page, up to timeout
        last: list[str] = []

        def clean() -> bool:
            nonlocal last
            last = problems()
            return not last

        try:
            wait_for(clean, timeout, "the widgets to render", interval=0.25)
        except TimeoutError:
            report.widget_problems.extend(last)

    def screenshot(self, path: Path, max_height: int = 16000) -> None:
        """A picture of the whole notebook: the viewport grows to the notebook's height for the shot."""
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.page.viewport_size
        frames = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        self.js("() => window.__dpnb.toTop()")
        self.js(frames)
        h = self.js("() => window.__dpnb.fullHeight()")
        tall = min(max_height, size["height"] + max(0, h["needed"] - h["client"]))
        self.page.set_viewport_size({"width": size["width"], "height": tall})
        try:
            self.js(frames)
            self.js("() => window.__dpnb.toTop()")
            self.js(frames)
            self.page.screenshot(path=str(path), full_page=True)
        finally:
            self.page.set_viewport_size(size)

    def check_slider_moves_figure(
        self,
        cell_index: int,
        shots: Path | None = None,
        timeout: float = 30.0,
        ways: tuple[str, ...] = ("arrow keys", "mouse drag"),
    ) -> list[str]:
        """Move the first slider of the widget in cell ``cell_index``; check the figure and readouts follow.

        The slider is moved twice, as a reader would: arrow keys on the focused handle, then a
        mouse drag of the handle. Each time the readout, the caption (an HTML widget) and the
        figure's pixels must change (``ways`` picks the moves). Returns what changed, step by step.
        Raises ``AssertionError`` with what did not.
        """
        tags = self.js("i => window.__dpnb.tagExplorer(i)", cell_index)
        assert tags["sliders"] >= 1, f"no slider rendered in the output of cell {cell_index} ({tags})"
        assert tags["area"] > 0, (
            f"no visible figure (image or ipympl canvas) in the output of cell {cell_index} ({tags})"
        )
        out = self.page.locator(f'[data-dpnb-cell="{cell_index}"] .jp-OutputArea')
        handle = out.locator(".widget-slider .noUi-handle").first
        readout = out.locator(".widget-slider .widget-readout").first
        figure = out.locator('[data-dpnb-figure="1"]').first
        caption = out.locator(".widget-html-content")
        figure.scroll_into_view_if_needed()

        def state() -> dict:
            return {
                "readout": readout.inner_text().strip(),
                "caption": " | ".join(caption.all_inner_texts()),
                "pixels": figure.screenshot(animations="disabled"),
            }

        def error_shown() -> str:
            # dpnotebook's explorers show callback errors in the widget (a red box with a traceback)
            texts = [t for t in out.locator("details").all_inner_texts() if "traceback" in t.lower()]
            return texts[0][:500] if texts else ""

        log = []
        before = state()
        if shots is not None:
            shots.parent.mkdir(parents=True, exist_ok=True)
            shots.with_name(shots.stem + "-0-before.png").write_bytes(before["pixels"])
        moves = [
            (how, move) for how, move in (("arrow keys", self._press_arrows), ("mouse drag", self._drag)) if how in ways
        ]
        for step, (how, move) in enumerate(moves, start=1):
            move(handle)
            changed: dict = {}

            def follows(changed: dict = changed, before: dict = before) -> bool:  # bound: this move's
                now = state()
                changed.update(now=now, keys=[k for k in now if now[k] != before[k]])
                return len(changed["keys"]) == len(now)

            try:
                wait_for(follows, timeout, f"the figure to follow the slider ({how})", interval=0.2)
            except TimeoutError:
                missing = sorted(set(before) - set(changed.get("keys", [])))
                raise AssertionError(
                    f"moving the slider by {how} did not change: {missing} "
                    f"(readout {before['readout']!r} -> {changed['now']['readout']!r}); "
                    f"widget error: {error_shown() or 'none'}"
                ) from None
            now = changed["now"]
            if shots is not None:
                shots.with_name(f"{shots.stem}-{step}-{how.replace(' ', '-')}.png").write_bytes(now["pixels"])
            log.append(f"{how}: readout {before['readout']} -> {now['readout']}; caption and figure changed")
            before = now
        err = error_shown()
        assert not err, f"the widget shows an error after moving the slider: {err}"
        return log

    def _press_arrows(self, handle: Any, presses: int = 12) -> None:
        """Arrow keys on the focused handle, towards the side with more room."""
        now, lo, hi = (float(handle.get_attribute(a)) for a in ("aria-valuenow", "aria-valuemin", "aria-valuemax"))
        key = "ArrowRight" if now - lo <= hi - now else "ArrowLeft"
        handle.focus()
        for _ in range(presses):
            handle.press(key)

    def _drag(self, handle: Any) -> None:
        """Drag the handle by 40% of the track, towards the side with more room."""
        box = handle.bounding_box()
        track = handle.locator("xpath=ancestor::*[contains(@class, 'noUi-base')]").bounding_box()
        assert box is not None and track is not None, "the slider is not visible"
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        centre = track["x"] + track["width"] / 2
        dx = 0.4 * track["width"] * (1 if x < centre else -1)
        mouse = self.page.mouse
        mouse.move(x, y)
        mouse.down()
        mouse.move(x + dx / 2, y, steps=5)
        mouse.move(x + dx, y, steps=5)
        mouse.up()
