"""Check the rendered book as a reader sees it: every chapter and book page at 1280 px width.

A headless Chromium opens each page of ``notebooks/`` and ``book/`` in the built HTML at
1280x900 and measures the laid-out page with JavaScript (driven over the DevTools protocol)::

    python -m tools.page_check _build/html
    python -m tools.page_check _build/html --screenshots _build/page-shots --strict-code

Three rules, one column each in the per-page table:

* ``tables cut off``: an output table (``div.cell_output table``) wider than the text column
  with no horizontally scrolling box around it inside the column; part of it is out of reach
  (it spills under the sidebar or is clipped). Always a failure.
* ``tall code``: a code input cell taller than ``--code-budget`` pixels (600) that is shown
  expanded; a hidden input (a collapsed ``<details>``) is fine. A failure with ``--strict-code``.
* ``scaled figures``: an output image drawn narrower than its natural width (1 px allowed),
  so its text is smaller than it was drawn. A failure with ``--strict-figures``.

Exit status: 0 when no failing rule is broken, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd

WIDTH, HEIGHT = 1280, 900
CODE_BUDGET_PX = 600
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PAGE_GLOBS = ("notebooks/*.html", "book/*.html", "workshop/*.html")
SCREENSHOT_MAX_PX = 32000  # a taller capture is cut there (PNG and painting limits)
SCROLLING = "wide tables (scroll)"  # reported, never a failure: a scroll bar reaches them
# rule -> (column in the table, the flag that makes it a failure; None: always a failure)
RULES = {
    "tables": ("tables cut off", None),
    "code": ("tall code", "strict_code"),
    "figures": ("scaled figures", "strict_figures"),
}

# Waits for web fonts and every image (lazy ones made eager), then two animation frames.
SETTLE_JS = r"""(async () => {
  document.querySelectorAll('img[loading="lazy"]').forEach(img => { img.loading = 'eager'; });
  const loaded = img => img.complete ? null
    : new Promise(done => { img.onload = done; img.onerror = done; });
  const settled = Promise.all([document.fonts.ready, ...[...document.images].map(loaded)]);
  await Promise.race([settled, new Promise(done => setTimeout(done, 5000))]);
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  return true;
})()"""

# Returns {"column": px, "scrolling": count, "tables": [...], "code": [...], "figures": [...]}:
# the text column's width, how many wide tables scroll sideways in it, one finding per item.
MEASURE_JS = r"""((codeBudget) => {
  const article = document.querySelector('main .bd-article') || document.querySelector('article')
    || document.querySelector('main') || document.body;
  const style = getComputedStyle(article), box = article.getBoundingClientRect();
  const left = box.left + parseFloat(style.borderLeftWidth) + parseFloat(style.paddingLeft);
  const right = box.right - parseFloat(style.borderRightWidth) - parseFloat(style.paddingRight);
  const cells = [...document.querySelectorAll('div.cell')];
  const where = el => {
    const cell = el.closest('div.cell');
    const code = cell ? (cell.querySelector('div.cell_input pre') || {}).textContent || '' : '';
    const line = code.split('\n').find(text => text.trim()) || '';
    return {cell: cell ? cells.indexOf(cell) : -1, code: line.trim().slice(0, 60)};
  };
  const shown = el => el.getClientRects().length > 0 && !el.closest('details:not([open])');
  const scrollsInColumn = el => {
    for (let box = el; box && box !== article; box = box.parentElement) {
      const overflow = getComputedStyle(box).overflowX, r = box.getBoundingClientRect();
      if ((overflow === 'auto' || overflow === 'scroll') && r.left >= left - 1
          && r.right <= right + 1) return true;
    }
    return false;
  };
  const round = x => Math.round(x);
  // a table that scrolls inside its own box is as wide as its content, not as its box
  const widthOf = t => Math.max(t.getBoundingClientRect().width, t.scrollWidth);
  const wide = [...document.querySelectorAll('div.cell_output table')]
    .filter(t => shown(t) && widthOf(t) > right - left + 1)
    .map(t => ({...where(t), width: round(widthOf(t)), scrolls: scrollsInColumn(t)}));
  const tables = wide.filter(t => !t.scrolls).map(({scrolls, ...t}) => t);
  const scrolling = wide.filter(t => t.scrolls).length;
  const code = [...document.querySelectorAll('div.cell_input')]
    .filter(c => shown(c) && c.getBoundingClientRect().height > codeBudget)
    .map(c => ({...where(c), height: round(c.getBoundingClientRect().height)}));
  const figures = [...document.querySelectorAll('div.cell_output img')]
    .filter(i => shown(i) && i.naturalWidth > 0 && i.clientWidth < i.naturalWidth - 1)
    .map(i => ({...where(i), natural: i.naturalWidth, shown: i.clientWidth,
                percent: round(100 * i.clientWidth / i.naturalWidth)}));
  return {column: round(right - left), scrolling, tables, code, figures};
})"""


def find_browser() -> str | None:
    """The first Chromium-family binary on PATH, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def book_pages(html_dir: Path) -> list[Path]:
    """Every chapter and book page of the built HTML, in name order."""
    return sorted(page for pattern in PAGE_GLOBS for page in html_dir.glob(pattern))


class DevTools:
    """One page target of a running Chromium, driven over its DevTools websocket."""

    def __init__(self, websocket_url: str, timeout_s: float = 60.0):
        import websocket  # websocket-client (a Jupyter dependency, listed in the test extra)

        self._socket = websocket.create_connection(
            websocket_url, timeout=timeout_s, suppress_origin=True
        )
        self._next_id, self._events = 0, []

    def call(self, method: str, **params) -> dict:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self._events.append(message)

    def wait_for(self, event: str) -> dict:
        """The next event named ``event`` (kept ones first)."""
        while True:
            while self._events:
                message = self._events.pop(0)
                if message["method"] == event:
                    return message.get("params", {})
            self._events.append(json.loads(self._socket.recv()))

    def open(self, url: str) -> None:
        """Navigate to ``url`` and wait for its load event."""
        self._events.clear()
        navigated = self.call("Page.navigate", url=url)
        if navigated.get("errorText"):
            raise RuntimeError(f"{url}: {navigated['errorText']}")
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def close(self) -> None:
        self._socket.close()


def _debugging_port(profile: Path, process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """The port Chromium chose: it writes it to DevToolsActivePort in its profile."""
    port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the browser exited at start (status {process.returncode})")
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            return int(port_file.read_text().splitlines()[0])
        time.sleep(0.1)
    raise RuntimeError(f"the browser opened no DevTools port within {timeout_s:.0f} s")


@contextlib.contextmanager
def launched_browser(binary: str):
    """A headless Chromium with one blank page at WIDTH x HEIGHT; yields its DevTools."""
    with tempfile.TemporaryDirectory(prefix="page-check-", ignore_cleanup_errors=True) as profile:
        command = [
            binary, "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={profile}",
            "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-extensions", f"--window-size={WIDTH},{HEIGHT}", "about:blank",
        ]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        devtools = None
        try:
            port = _debugging_port(Path(profile), process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
                targets = json.load(r)
            page = next(t for t in targets if t.get("type") == "page")
            devtools = DevTools(page["webSocketDebuggerUrl"])
            devtools.call("Page.enable")
            devtools.call(
                "Emulation.setDeviceMetricsOverride",
                width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False,
            )  # fmt: skip
            yield devtools
        finally:
            if devtools is not None:
                devtools.close()
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure_page(devtools: DevTools, page: Path, code_budget: int) -> dict:
    """Open ``page``, let it settle, and return MEASURE_JS's findings."""
    devtools.open(page.resolve().as_uri())
    devtools.evaluate(SETTLE_JS)
    return devtools.evaluate(f"({MEASURE_JS})({int(code_budget)})")


def save_screenshot(devtools: DevTools, target: Path) -> None:
    """A PNG of the whole page (its first SCREENSHOT_MAX_PX pixels) at WIDTH.

    The viewport is made as tall as the page for the capture (capturing beyond a 900 px
    viewport lays the page out again at another width), then set back.
    """
    size = devtools.call("Page.getLayoutMetrics")["cssContentSize"]
    height = min(int(size["height"]) + 1, SCREENSHOT_MAX_PX)
    metrics = {"width": WIDTH, "deviceScaleFactor": 1, "mobile": False}
    devtools.call("Emulation.setDeviceMetricsOverride", height=height, **metrics)
    try:
        devtools.evaluate(SETTLE_JS)
        shot = devtools.call("Page.captureScreenshot", format="png")
    finally:
        devtools.call("Emulation.setDeviceMetricsOverride", height=HEIGHT, **metrics)
    target.write_bytes(base64.b64decode(shot["data"]))


def report(findings: dict[str, dict]) -> pd.DataFrame:
    """Per-page counts, one row a page (its path in the build), one column a rule."""
    rows = [
        {"page": name, "column px": found.get("column", 0), SCROLLING: found.get("scrolling", 0)}
        | {column: len(found.get(rule, [])) for rule, (column, _) in RULES.items()}
        for name, found in findings.items()
    ]
    columns = ["page", "column px", SCROLLING, *(column for column, _ in RULES.values())]
    return pd.DataFrame(rows, columns=columns)


def details(findings: dict[str, dict]) -> list[str]:
    """One line per finding: page, rule, cell number, the size that broke the rule, its code."""
    lines = []
    for name, found in findings.items():
        for rule, (column, _) in RULES.items():
            for item in found.get(rule, []):
                size = {k: v for k, v in item.items() if k not in ("cell", "code")}
                measured = ", ".join(f"{k} {v}" for k, v in size.items())
                lines.append(
                    f"{name}: {column}: cell {item.get('cell')} ({measured}): {item.get('code')}"
                )
    return lines


def failures(table: pd.DataFrame, strict_code: bool, strict_figures: bool) -> list[str]:
    """The broken rules that fail the check, e.g. ``['tables cut off: 2']``."""
    strict = {"strict_code": strict_code, "strict_figures": strict_figures}
    failed = []
    for column, flag in RULES.values():
        total = int(table[column].sum()) if len(table) else 0
        if total and (flag is None or strict[flag]):
            failed.append(f"{column}: {total}")
    return failed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.page_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("html_dir", type=Path, help="the built book, e.g. _build/html")
    parser.add_argument("--screenshots", type=Path, metavar="DIR", help="save a PNG per page")
    parser.add_argument("--browser", help=f"Chromium binary (default: first of {BROWSERS})")
    parser.add_argument("--code-budget", type=int, default=CODE_BUDGET_PX, metavar="PX",
                        help=f"tallest expanded code cell, in pixels (default {CODE_BUDGET_PX})")
    parser.add_argument("--strict-code", action="store_true", help="fail on tall code cells")
    parser.add_argument("--strict-figures", action="store_true", help="fail on scaled figures")
    args = parser.parse_args(argv)
    if not args.html_dir.is_dir():
        parser.error(f"html_dir: {args.html_dir} is not a directory (build the book first)")
    args.pages = book_pages(args.html_dir)
    if not args.pages:
        parser.error(f"html_dir: no pages match {' or '.join(PAGE_GLOBS)} in {args.html_dir}")
    if args.code_budget <= 0:
        parser.error(f"--code-budget: must be a positive number of pixels, got {args.code_budget}")
    args.browser = shutil.which(args.browser) if args.browser else find_browser()
    if args.browser is None:
        parser.error(f"--browser: no Chromium found (looked for {', '.join(BROWSERS)})")
    if args.screenshots is not None and args.screenshots.exists() and not args.screenshots.is_dir():
        parser.error(f"--screenshots: {args.screenshots} exists and is not a directory")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    findings = {}
    try:
        with launched_browser(args.browser) as devtools:
            for page in args.pages:
                name = page.relative_to(args.html_dir).as_posix()
                findings[name] = measure_page(devtools, page, args.code_budget)
                if args.screenshots is not None:
                    save_screenshot(devtools, args.screenshots / f"{page.stem}.png")
    except Exception as error:  # the browser or a page failed: say so, no traceback
        print(f"page check: could not measure the pages: {error}", file=sys.stderr)
        return 1
    table = report(findings)
    print(f"Pages at {WIDTH}x{HEIGHT} px, code budget {args.code_budget} px")
    print(table.to_string(index=False))
    for line in details(findings):
        print("  " + line)
    failed = failures(table, args.strict_code, args.strict_figures)
    print("page check: " + ("FAILED (" + "; ".join(failed) + ")" if failed else "passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
