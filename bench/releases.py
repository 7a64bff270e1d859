"""The releases of releases.toml, built from git (scripts/build-releases.sh, cached by
commit id): the interpreter of each, for the upgrade tests and benchmarks."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _table() -> dict[str, dict]:
    with open(ROOT / "releases.toml", "rb") as f:
        return tomllib.load(f)["releases"]


def releases() -> list[str]:
    """Every release, oldest first."""
    return list(_table())


def metadata_level(version: str) -> int:
    """The straitmq.metadata.version level release `version` writes and reads."""
    return int(_table()[version]["metadata_level"])


def previous_release() -> str:
    """The newest release: what this checkout upgrades from."""
    return releases()[-1]


def release_python(version: str) -> str:
    """The python of release `version`, built first if needed. Run it with `-P`, so that
    a checkout as the working directory does not shadow the release's packages. Fails
    (AssertionError) saying why when it cannot be built, e.g. a shallow clone."""
    r = subprocess.run(
        [str(ROOT / "scripts" / "build-releases.sh"), "--python", version],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, f"cannot build release {version}:\n{r.stderr[-3000:]}"
    return r.stdout.strip().splitlines()[-1]
