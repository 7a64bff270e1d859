"""Check the import contracts of pyproject's [tool.importlinter] (the floors of the house).

import-linter (grimp) finds a package's modules by walking the folder of its top-level
package, but `straitmq` is spread over several folders ([tool.setuptools] package-dir:
services/broker is straitmq.broker, cli is straitmq.cli, ...), which the editable install
joins with an import hook grimp does not consult. So this lays the namespace out as one
tree of symbolic links, exactly as the wheel would hold it, puts it first on the path and
runs `lint-imports` over it. Arguments are passed on (e.g. --verbose).

    .venv/bin/python scripts/lint_imports.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lay_out(tree: Path) -> None:
    """tree/straitmq/... as the wheel would install it, each folder a link to the
    checkout's own (the tree is read, never written)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs: dict[str, str] = setup["package-dir"]
    # Parents before children: straitmq's own files, then the folders mapped under it.
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = tree.joinpath(*name.split("."))
        source = ROOT / dirs[name]
        if name.count(".") == 0:
            target.mkdir(parents=True)
            for entry in source.iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            if target.is_symlink():  # a folder of the parent's with the same name
                raise SystemExit(f"{dirs[name]} and {target} both claim {name}")
            target.symlink_to(source, target_is_directory=True)


def main(argv: list[str]) -> int:
    from importlinter.cli import lint_imports_command

    with tempfile.TemporaryDirectory(prefix="straitmq-imports-") as tmp:
        tree = Path(tmp)
        lay_out(tree)
        # grimp finds `straitmq` with importlib, and lint-imports puts the working
        # directory first on the path: run from the tree, so that it wins over the
        # checkout's straitmq/ folder and the editable install's hook.
        os.chdir(tree)
        args = [str(ROOT / "pyproject.toml"), "--no-cache", *argv]
        try:
            lint_imports_command.main(args=args, prog_name="lint-imports")
        except SystemExit as e:
            return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
