"""The lecturer's two commands.

``python -m dpnotebook.exercises solve tutorials/ OUT_DIR [--execute]`` writes the solution set:
every notebook with its exercise cells replaced by the blocks of ``solutions/<stem>.py`` (the
``solutions/`` folder beside ``tutorials/``, or ``--solutions DIR``), outputs cleared, or run
with ``--execute``, where a failing check stops the command.

``python -m dpnotebook.exercises student tutorials/ [OUT_DIR] [--clear-outputs]`` validates the
student set (every exercise cell is a stub with a solution block, every block has a cell, every
check cell's stored output says "not yet solved") and, given ``OUT_DIR``, copies the notebooks
there; with ``--clear-outputs`` the copies hold no outputs, so that no "predict first" prompt is
answered before the student runs the cell. It exits with status 1 and lists the problems when
anything is off.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dpnotebook.exercises._notebooks import (
    default_solutions_dir,
    execute,
    problems,
    read_notebook,
    solved,
    without_outputs,
    write_notebook,
)


def _notebooks(folder: Path) -> list[Path]:
    found = sorted(Path(folder).glob("*.ipynb"))
    if not found:
        raise SystemExit(f"no notebooks in {folder!s}: give the tutorials folder, e.g. 'tutorials/'")
    return found


def _validate(notebooks: list[Path], solutions_dir: Path) -> None:
    found = [problem for notebook in notebooks for problem in problems(notebook, solutions_dir)]
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
    student.add_argument(
        "--clear-outputs", action="store_true", help="copy the notebooks without outputs (needs OUT_DIR)"
    )
    for command in (solve, student):
        command.add_argument(
            "--solutions", type=Path, default=None, help="the solutions folder (default: solutions/ beside TUTORIALS)"
        )
    args = parser.parse_args(argv)
    if args.command == "student" and args.clear_outputs and args.out_dir is None:
        parser.error(
            "--clear-outputs writes a cleared copy and needs OUT_DIR: "
            "python -m dpnotebook.exercises student tutorials/ OUT_DIR --clear-outputs"
        )

    notebooks = _notebooks(args.tutorials)
    solutions_dir = default_solutions_dir(args.tutorials) if args.solutions is None else args.solutions
    _validate(notebooks, solutions_dir)
    if args.command == "student":
        if args.out_dir is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            for notebook in notebooks:
                if args.clear_outputs:
                    write_notebook(without_outputs(read_notebook(notebook)), args.out_dir / notebook.name)
                else:
                    shutil.copyfile(notebook, args.out_dir / notebook.name)
        print(
            f"student set: {len(notebooks)} notebooks, every exercise a stub with a solution"
            + (f"; copied to {args.out_dir}" if args.out_dir is not None else "")
            + (" without outputs" if args.clear_outputs else "")
        )
        return
    for notebook in notebooks:
        result = solved(notebook, solutions_dir)
        if args.execute:
            print(f"running {notebook.name} ...", flush=True)
            result = execute(result, cwd=notebook.parent.resolve())
        write_notebook(result, args.out_dir / notebook.name)
    print(f"solution set: {len(notebooks)} notebooks written to {args.out_dir}")


if __name__ == "__main__":
    main()
