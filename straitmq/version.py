"""Which StraitMQ this is: the release version and the git commit it was built from.

    VERSION     "0.2.0.dev0": the installed distribution's version (pyproject's
                [project] version) when this code was installed from a wheel, else
                `straitmq.__version__` (a source tree, or an editable install whose
                metadata keeps the version of its last install): the one constant a
                release changes (tests/test_releases.py keeps pyproject's version and
                the chart's appVersion equal to it)
    commit()    the full commit id: $STRAITMQ_COMMIT (the image sets it from a build
                arg), else straitmq/_build_commit.txt (git-ignored, written by a build
                that has no git), else `git rev-parse HEAD` in this file's checkout,
                else "unknown"
    describe()  "0.2.0.dev0 (commit 1379679a4ec5)", for --version and startup lines

Reported by `strait --version`, every process's startup log line and the
`straitmq_build_info` gauge on /metrics. Standard library only (the ground floor).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

from straitmq import __version__

DISTRIBUTION = "straitmq"
COMMIT_ENV = "STRAITMQ_COMMIT"
COMMIT_FILE = Path(__file__).with_name("_build_commit.txt")
UNKNOWN = "unknown"
SHORT = 12  # hex digits of the commit in describe()
GIT_TIMEOUT_S = 2.0
_HEX_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1, or a SHA-256 repository


def _version() -> str:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return __version__
    # Only metadata installed together with this very file counts (a wheel's RECORD lists
    # it). An editable install's (the .venv's) and a source tree's straitmq.egg-info keep
    # the version of their last build while the code moves on: the source is right there.
    ours = Path(__file__).resolve()
    for line in (dist.read_text("RECORD") or "").splitlines():
        name = line.split(",", 1)[0]
        if name == f"{DISTRIBUTION}/{ours.name}":
            try:
                same = Path(str(dist.locate_file(name))).resolve() == ours
            except OSError:
                same = False
            return dist.version if same and dist.version else __version__
    return __version__


VERSION = _version()


def _valid(value: str | None) -> str | None:
    value = (value or "").strip().lower()
    return value if _HEX_COMMIT.fullmatch(value) else None


def _git_head(source: Path) -> str | None:
    """HEAD of the checkout `source` (this file) belongs to. Only a checkout's own
    straitmq/ counts: a wheel installed into a virtualenv that happens to sit inside
    some git repository (this one's .venv too) must not report that repository's HEAD."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=source.parent,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2:
        return None
    top, head = lines
    try:
        ours = (Path(top) / "straitmq" / source.name).resolve() == source
    except OSError:
        return None
    return _valid(head) if ours else None


@functools.cache
def commit() -> str:
    """The full id of the commit this code was built from, or "unknown" (cached: the
    first call may run git)."""
    from_env = os.environ.get(COMMIT_ENV, "").strip()
    if from_env and from_env != UNKNOWN:  # the image's ARG default is "unknown"
        return _valid(from_env) or from_env
    try:
        from_file = _valid(COMMIT_FILE.read_text())
    except OSError:
        from_file = None
    return from_file or _git_head(Path(__file__).resolve()) or UNKNOWN


def describe() -> str:
    """'0.2.0.dev0 (commit 1379679a4ec5)'."""
    c = commit()
    return f"{VERSION} (commit {c[:SHORT] if c != UNKNOWN else c})"


__all__ = ["COMMIT_ENV", "VERSION", "commit", "describe"]
