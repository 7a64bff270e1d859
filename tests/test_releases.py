"""Releases: one version constant, the list of releases, and what a process says it runs.

The code's version is `straitmq.__version__` (straitmq/version.py reads it); pyproject's
`[project] version` and the Helm chart's appVersion (the default image tag) must equal
it. releases.toml names every release and the full commit it was cut from, oldest first;
CHANGELOG.md has a section, with upgrading notes, for each. `strait --version`, the
startup log lines and the `straitmq_build_info` gauge report the version and the commit.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import tomllib

import pytest
import yaml
from conftest import ROOT
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

import straitmq
from straitmq import version

RELEASES = tomllib.loads((ROOT / "releases.toml").read_text())["releases"]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
HEX40 = re.compile(r"[0-9a-f]{40}")


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )


def full_history() -> None:
    """The release commits are checked against git history: not in a shallow clone."""
    if git("rev-parse", "--is-shallow-repository").stdout.strip() != "false":
        pytest.skip("not a full git clone: the release commits cannot be looked up")


# -- one version ----------------------------------------------------------------------


def test_pyproject_package_and_chart_say_the_same_version() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "straitmq" / "Chart.yaml").read_text())
    assert pyproject == straitmq.__version__, "pyproject.toml's version"
    assert chart["appVersion"] == straitmq.__version__, "Chart.yaml's appVersion"
    assert str(Version(straitmq.__version__)) == straitmq.__version__, "PEP 440, normalized"
    # The installed code reports the same (the .venv is an editable install: the source's).
    assert version.VERSION == straitmq.__version__


def test_the_version_is_not_older_than_the_newest_release() -> None:
    newest = max(Version(v) for v in RELEASES)
    assert Version(straitmq.__version__) >= newest, (
        f"straitmq.__version__ {straitmq.__version__} is older than release {newest}"
    )


# -- releases.toml --------------------------------------------------------------------


def test_releases_are_listed_oldest_first_each_with_its_full_commit() -> None:
    assert RELEASES, "releases.toml lists no release"
    versions = [Version(v) for v in RELEASES]
    assert [str(v) for v in versions] == list(RELEASES), "versions as PEP 440 writes them"
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    dates = []
    for name, release in RELEASES.items():
        assert HEX40.fullmatch(release["commit"]), f"{name}: commit must be 40 hex digits"
        assert not Version(name).is_devrelease, f"{name}: a release is not a .dev version"
        dates.append(datetime.date.fromisoformat(release["date"]))
    assert dates == sorted(dates), "release dates go forward"


def test_every_release_commit_is_in_history_and_has_its_version() -> None:
    full_history()
    for name, release in RELEASES.items():
        commit = release["commit"]
        assert git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, (
            f"{name}: {commit} is not an ancestor of HEAD"
        )
        init = git("show", f"{commit}:straitmq/__init__.py").stdout
        assert f'__version__ = "{name}"' in init, f"{name}: {commit} says another version"


def test_every_release_says_the_levels_it_supports() -> None:
    """`strait upgrade plan --to-release` and the upgrade tests need each release's
    feature ranges (features.RELEASES) and its straitmq.metadata.version level
    (releases.toml), which must agree: a release cut adds both."""
    from straitmq.metadata import features

    assert list(features.RELEASES) == list(RELEASES), "features.RELEASES: one per release"
    for name, release in RELEASES.items():
        _, hi = features.RELEASES[name][features.STRAITMQ]
        assert release["metadata_level"] == hi, f"{name}: metadata_level is not {hi}"
        assert hi <= features.LATEST[features.STRAITMQ], f"{name}: a level this code lacks"


def test_the_changelog_has_every_release_with_its_date_and_upgrading_notes() -> None:
    sections = re.split(r"^## ", CHANGELOG, flags=re.M)[1:]
    headings = [s.split("\n", 1)[0] for s in sections]
    assert headings[0] == "[Unreleased]", "the changelog starts with ## [Unreleased]"
    released = {
        m[1]: m[2] for h in headings[1:] if (m := re.fullmatch(r"\[(.+)\] - (\d{4}-\d\d-\d\d)", h))
    }
    assert len(released) == len(headings) - 1, f"headings not `[version] - date`: {headings}"
    listed = {v: r["date"] for v, r in RELEASES.items()}
    if not Version(straitmq.__version__).is_devrelease:
        # The release commit itself: its own section is there, releases.toml names it
        # from the next commit on (a commit cannot name itself).
        assert straitmq.__version__ in released, "a release commit has its changelog section"
        listed[straitmq.__version__] = released[straitmq.__version__]
    assert released == listed
    assert list(released) == list(reversed(listed)), "newest first"
    for s in sections:
        assert "\n### Upgrading\n" in s, f"## {s.split(chr(10), 1)[0]}: no ### Upgrading"


# -- what a process says it runs ----------------------------------------------------


def test_the_commit_is_the_checkouts_head_unless_the_image_says() -> None:
    head = git("rev-parse", "HEAD").stdout.strip()
    if os.environ.get(version.COMMIT_ENV, "unknown") == "unknown":
        assert version.commit() == head
    assert version.describe() == f"{straitmq.__version__} (commit {version.commit()[:12]})"


def test_strait_version_prints_the_version_and_the_commit() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    env = {**os.environ, version.COMMIT_ENV: commit}
    out = subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"strait {straitmq.__version__} (commit 0123456789ab)\n"
    # Without the image's variable and without git: the commit is unknown.
    env = {k: v for k, v in os.environ.items() if k != version.COMMIT_ENV}
    code = "from straitmq.version import commit; print(commit())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PATH": "/nonexistent"},  # no git to ask
        cwd="/",
    )
    assert out.returncode == 0 and out.stdout == "unknown\n", out.stderr


def test_every_telemetry_serves_build_info() -> None:
    from straitmq.telemetry import Telemetry

    telemetry = Telemetry("straitmq-controller", "test")
    try:
        text = telemetry.render().decode()
    finally:
        telemetry.shutdown()
    samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "straitmq_build_info"
    ]
    assert [(s.labels, s.value) for s in samples] == [
        ({"version": straitmq.__version__, "commit": version.commit()}, 1.0)
    ]
