"""The lecturer's two commands: write the solution set, validate (and copy) the student set.

``python -m dpnotebook.exercises solve tutorials/ OUT_DIR [--execute]`` writes every notebook with its
exercise cells replaced by the blocks of ``solutions/<stem>.py``, outputs cleared (or run with
``--execute``, where a failing check stops the command). ``python -m dpnotebook.exercises student
tutorials/ [OUT_DIR] [--clear-outputs]`` checks the student set (see :func:`problems`) and copies it
to ``OUT_DIR``, without outputs with ``--clear-outputs`` so that no "predict first" prompt is answered
in advance; it exits with status 1 and lists the problems when anything is off.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from dpnotebook.exercises._notebooks import execute, problems, read_notebook, solved, without_outputs, write_notebook


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
    notebooks = sorted(Path(args.tutorials).glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no notebooks in {args.tutorials!s}: give the tutorials folder, e.g. 'tutorials/'")
    found = [problem for notebook in notebooks for problem in problems(notebook, args.solutions)]
    if found:
        print("\n".join(found), file=sys.stderr)
        raise SystemExit(1)
    if args.command == "student":
        for notebook in notebooks if args.out_dir is not None else []:
            args.out_dir.mkdir(parents=True, exist_ok=True)
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
        result = solved(notebook, args.solutions)
        if args.execute:
            print(f"running {notebook.name} ...", flush=True)
            result = execute(result, cwd=notebook.parent.resolve())
        write_notebook(result, args.out_dir / notebook.name)
    print(f"solution set: {len(notebooks)} notebooks written to {args.out_dir}")


if __name__ == "__main__":
    main()
