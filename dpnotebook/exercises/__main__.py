"""The lecturer's two commands.

``python -m dpnotebook.exercises solve tutorials/ OUT_DIR [--execute]`` writes the solution set:
every notebook with its exercise cells replaced by ``tutorials/solutions/<stem>.py``'s blocks
(outputs cleared, or run with ``--execute``, where a failing check stops the command).

``python -m dpnotebook.exercises student tutorials/ [OUT_DIR]`` validates the student set (every
exercise cell is a stub with a solution block, every block has a cell, every check cell's stored
output says "not yet solved") and, given ``OUT_DIR``, copies the notebooks there. It exits with
status 1 and lists the problems when anything is off.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dpnotebook.exercises.notebooks import execute, problems, solved, write_notebook


def _notebooks(folder: Path) -> list[Path]:
    found = sorted(Path(folder).glob("*.ipynb"))
    if not found:
        raise SystemExit(f"no notebooks in {folder!s}: give the tutorials folder, e.g. 'tutorials/'")
    return found


def _validate(notebooks: list[Path]) -> None:
    found = [problem for notebook in notebooks for problem in problems(notebook)]
    if found:
        print("\n".join(found), file=sys.stderr)
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dpnotebook.exercises", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    solve = commands.add_parser("solve", help="write the solution set")
    solve.add_argument("tutorials", type=Path)
    solve.add_argument("out_dir", type=Path)
    solve.add_argument("--execute", action="store_true", help="run each solved notebook (checks must pass)")
    student = commands.add_parser("student", help="validate the student set, and copy it to OUT_DIR if given")
    student.add_argument("tutorials", type=Path)
    student.add_argument("out_dir", type=Path, nargs="?")
    args = parser.parse_args(argv)

    notebooks = _notebooks(args.tutorials)
    _validate(notebooks)
    if args.command == "student":
        if args.out_dir is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            for notebook in notebooks:
                shutil.copyfile(notebook, args.out_dir / notebook.name)
        print(
            f"student set: {len(notebooks)} notebooks, every exercise a stub with a solution"
            + (f"; copied to {args.out_dir}" if args.out_dir is not None else "")
        )
        return
    for notebook in notebooks:
        result = solved(notebook)
        if args.execute:
            print(f"running {notebook.name} ...", flush=True)
            result = execute(result, cwd=notebook.parent.resolve())
        write_notebook(result, args.out_dir / notebook.name)
    print(f"solution set: {len(notebooks)} notebooks written to {args.out_dir}")


if __name__ == "__main__":
    main()
