"""Wheels a lent GPU machine needs to run ``tools/gpu-session``: what it lacks of the test run's dependencies.

The machine has its own CUDA torch and no internet, so the packages the GPU test path, the tutorials
and the Opacus benchmarks import travel as wheels (docs/performance.md, "Measure on your machine").
This walks the requirements of :data:`ROOTS` through the packages installed here (the versions of
``make install``), leaves out torch and CUDA's own packages and every package named in ``--have``
(what the machine already holds: one name per line, or a ``pip list``), and downloads the rest as
wheels for the machine's Python (3.12, x86-64 Linux, ``--no-deps``)::

    .venv/bin/python tools/gpu_wheels.py .whl --have have.txt     # --dry-run: list them, download nothing

On the machine: ``pip install --no-index --no-deps --target /tmp/site .whl/*.whl`` and
``PYTHONPATH=/tmp/site``, then ``tools/gpu-session OUT``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

#: What the GPU session imports beyond the standard library and torch.
ROOTS = ("dpnotebook", "nbval", "ipykernel", "pytest-xdist", "hypothesis", "opacus")
#: Never carried: the machine's own CUDA build of torch and what comes with it.
NEVER = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|setuptools|pip|wheel)$")
#: The machine's Python and platform (``pip download`` matches each manylinux tag exactly).
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    f"--platform={p}_x86_64"
    for p in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_24", "manylinux_2_17", "manylinux2014", "manylinux1")
]
#: The requirement markers are read for that machine.
ENVIRONMENT = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "extra": ""}


def canonical(name: str) -> str:
    """The name as pip compares names: ``Foo_Bar.baz`` and ``foo-bar-baz`` are one package.

    >>> canonical("Foo_Bar.baz")
    'foo-bar-baz'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...] = ROOTS, extras: tuple[str, ...] = ("widgets",)) -> dict[str, str]:
    """``{name: installed version}`` of ``roots`` and everything they require, as installed here.

    ``extras`` are followed for the roots (dpnotebook's widgets: the tutorials need them); a requirement
    whose marker excludes the machine (another platform or Python) is not.

    >>> found = closure(("nbval",), ())
    >>> "nbformat" in found and "nbval" in found
    True
    """
    found: dict[str, str] = {}
    todo = [(canonical(r), set(extras)) for r in roots]
    while todo:
        name, wanted = todo.pop()
        if name in found or NEVER.match(name):
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            env = [{**ENVIRONMENT, "extra": e} for e in wanted or {""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in env):
                todo.append((canonical(req.name), set(req.extras)))
    found.pop("dpnotebook", None)  # the checkout itself travels
    return dict(sorted(found.items()))


def have(text: str) -> set[str]:
    """The package names of a list, one per line or ``pip list``'s table (its header ignored).

    >>> sorted(have("Package Version\\n------- -------\\nNumPy 2.5.2\\nscikit_learn\\n"))
    ['numpy', 'scikit-learn']
    """
    names = {canonical(line.split()[0]) for line in text.splitlines() if line.strip() and line[0] != "-"}
    return names - {"package"}


def main(argv: list[str] | None = None) -> list[str]:
    """Download (or with ``--dry-run`` list) the wheels to carry; returns ``name==version`` of each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder for the wheels (e.g. .whl, ignored by git)")
    parser.add_argument("--have", type=Path, help="the packages the machine already holds: names or a pip list")
    parser.add_argument("--dry-run", action="store_true", help="list what would be downloaded")
    args = parser.parse_args(argv)
    there = have(args.have.read_text()) if args.have else set()
    wanted = [f"{name}=={version}" for name, version in closure().items() if name not in there]
    print("\n".join(wanted))
    if not args.dry_run and wanted:
        args.dest.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(args.dest), *TARGET]
        subprocess.run([*pip, *wanted], check=True)
        size = sum(f.stat().st_size for f in args.dest.glob("*.whl")) / 2**20
        print(f"{len(wanted)} wheels, {size:.1f} MiB in {args.dest} (a device call carries at most 64 MiB)")
    return wanted


if __name__ == "__main__":
    main()
