"""Time and peak memory of every tutorial, each run in its own process.

``python -m dpnotebook.benchmarks.tutorials [tutorials/*.ipynb]``

Each notebook's code cells run in a fresh process, in an IPython shell (as in a kernel, without the
kernel's ~60 MB); its wall time and peak memory (``VmHWM``) are checked against the tutorials' budgets:
60 s each, 5 minutes together, 1.5 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BUDGET_SECONDS, BUDGET_TOTAL_SECONDS, BUDGET_MB = 60.0, 300.0, 1536.0

_CHILD = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
code = json.load(open(sys.argv[1]))
shell = InteractiveShell.instance()
start = time.perf_counter()
for cell in code["cells"]:
    if cell["cell_type"] == "code":
        shell.run_cell("".join(cell["source"]), silent=True).raise_error()
seconds = time.perf_counter() - start
peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"seconds": seconds, "peak_mb": peak}))
"""


def measure(notebook: Path) -> dict[str, float]:
    """Run ``notebook``'s code cells in a new process; its seconds and peak MB."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(notebook)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{notebook} failed outside a kernel:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - start
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args()
    notebooks = args.notebooks or sorted(Path("tutorials").glob("*.ipynb"))
    total = 0.0
    print(f"{'tutorial':34s} {'cells s':>8s} {'process s':>10s} {'peak MB':>8s}  within budget")
    for nb in notebooks:
        r = measure(nb)
        total += r["process_seconds"]
        ok = r["process_seconds"] <= BUDGET_SECONDS and r["peak_mb"] <= BUDGET_MB
        print(f"{nb.stem:34s} {r['seconds']:8.1f} {r['process_seconds']:10.1f} {r['peak_mb']:8.0f}  {ok}")
    print(f"{'all together':34s} {'':8s} {total:10.1f} {'':8s}  {total <= BUDGET_TOTAL_SECONDS}")


if __name__ == "__main__":
    main()
