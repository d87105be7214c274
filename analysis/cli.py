"""The command line the analysis steps share: ``--results DIR``, one option per file a step reads or writes.

By hand, ``--results`` alone puts every file where the next step and the report look for it
(``DIR/tables/``, ``DIR/figures/``). The Snakefile names every file instead, its rule's declared inputs
and outputs, so that each step reads and writes exactly what its rule declares and nothing else.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def parser(description: str, files: dict[str, str | Path]) -> argparse.ArgumentParser:
    """``--results`` and one ``--<name>`` option per entry of ``files``, name: default path relative to
    ``--results`` (unless absolute). A default with a ``*`` is a glob, and its option takes several
    paths; ``@FILE`` stands for the arguments in FILE, one a line, for more paths than a command
    line holds."""
    parser = argparse.ArgumentParser(description=description, fromfile_prefix_chars="@")
    parser.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="results directory, where every file below is by default (default: results)",
    )
    for name, default in files.items():
        where = f"default: {default}" if Path(default).is_absolute() else f"default: DIR/{default}"
        many = "+" if "*" in str(default) else None
        parser.add_argument("--" + name.replace("_", "-"), type=Path, nargs=many, help=where)
    return parser


def resolve(args: argparse.Namespace, files: dict[str, str | Path]) -> dict[str, Path | list[Path]]:
    """Every file of ``files``: the path given on the command line, else its default under ``--results``."""
    resolved: dict[str, Path | list[Path]] = {}
    for name, default in files.items():
        given = getattr(args, name, None)
        if given is not None:
            resolved[name] = given
        elif "*" in str(default):
            resolved[name] = sorted(args.results.glob(str(default)))
        else:
            resolved[name] = args.results / default  # an absolute default stays as it is
    return resolved


def parse(
    description: str, files: dict[str, str | Path], argv: list[str] | None = None
) -> dict[str, Path | list[Path]]:
    """Parse a step's command line and return its files (see :func:`resolve`)."""
    return resolve(parser(description, files).parse_args(argv), files)


def defaults(files: dict[str, str | Path], results: Path) -> dict[str, Path | list[Path]]:
    """A step's files where ``--results results`` alone puts them."""
    return resolve(argparse.Namespace(results=Path(results)), files)
