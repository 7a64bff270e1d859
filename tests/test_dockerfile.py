"""The Dockerfile, checked structurally: these machines have no Docker engine to build it.

What a build would prove and can be checked without one: the base image, a numeric
non-root user (the one the chart and the operator's pods run as), every COPY source in
the repository and let through by .dockerignore, every package pyproject.toml declares
inside what is copied, every console script present, the dependency lock used and fresh,
the build backend pinned, and a CMD that names a real console script.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LOCK = ROOT / "requirements.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BASE_IMAGE = "python:3.11-slim"


@dataclass
class Instruction:
    cmd: str
    args: str
    flags: dict[str, str] = field(default_factory=dict)


@dataclass
class Stage:
    base: str
    name: str | None
    body: list[Instruction] = field(default_factory=list)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.body if i.cmd == cmd]


def instructions(text: str) -> list[Instruction]:
    """Dockerfile lines with continuations joined and comments dropped."""
    out: list[Instruction] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not logical):
            continue  # comments (and directives) may sit inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        if logical.strip():
            cmd, _, rest = logical.strip().partition(" ")
            flags = {}
            rest = rest.strip()
            while rest.startswith("--"):
                flag, _, rest = rest.partition(" ")
                k, _, v = flag[2:].partition("=")
                flags.setdefault(k, "")
                flags[k] = f"{flags[k]};{v}" if flags[k] else v
                rest = rest.strip()
            out.append(Instruction(cmd.upper(), rest, flags))
        logical = ""
    return out


def stages() -> tuple[dict[str, str], list[Stage]]:
    args: dict[str, str] = {}
    result: list[Stage] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins.cmd == "ARG" and not result:
            k, _, v = ins.args.partition("=")
            args[k] = v
        elif ins.cmd == "FROM":
            words = ins.args.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(base, name))
        else:
            assert result, f"{ins.cmd} before the first FROM"
            result[-1].body.append(ins)
    return args, result


def exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list), f"{ins.cmd} must use the exec (JSON) form: {ins.args}"
    return value


# -- .dockerignore, as Docker reads it -------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out)


def ignored(path: str) -> bool:
    """True if .dockerignore keeps `path` (relative to the context) out of the build
    context. Docker's rule: the last pattern matching the path or one of its parent
    directories decides; `!` patterns re-include."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = line[1:] if negate else line
        rules.append((negate, _pattern_regex(pat.strip("/"))))
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            excluded = not negate
    return excluded


# -- tests -----------------------------------------------------------------------------------


def test_every_stage_is_python_3_11_slim() -> None:
    _, all_stages = stages()
    assert len(all_stages) == 2, "a build stage and a runtime stage"
    assert [s.base for s in all_stages] == [BASE_IMAGE, BASE_IMAGE]
    assert all_stages[0].name == "build"


def test_runtime_runs_as_the_numeric_non_root_user_the_pods_use() -> None:
    _, all_stages = stages()
    final = all_stages[-1]
    users = final.all("USER")
    assert users, "the runtime stage must set USER"
    user = users[-1].args
    assert re.fullmatch(r"\d+(:\d+)?", user), (
        f"USER {user}: numeric, so Kubernetes' runAsNonRoot can verify it"
    )
    uid = int(user.split(":")[0])
    assert uid != 0
    # Nothing after USER may switch back to root.
    last_user = max(i for i, ins in enumerate(final.body) if ins.cmd == "USER")
    assert all(ins.cmd != "USER" for ins in final.body[last_user + 1 :])
    # The same uid everywhere: the chart's operator pod and the operator's StatefulSets.
    values = yaml.safe_load((ROOT / "charts" / "straitmq" / "values.yaml").read_text())
    assert values["operator"]["runAsUser"] == uid
    from straitmq.operator.render import RUN_AS

    assert uid == RUN_AS
    # The data directory belongs to that user.
    runs = " ".join(i.args for i in final.all("RUN"))
    assert f"chown {uid}:" in runs and "/data" in runs


def test_no_single_process_entrypoint_and_cmd_is_a_console_script() -> None:
    _, all_stages = stages()
    final = all_stages[-1]
    entry = final.all("ENTRYPOINT")
    assert entry and exec_form(entry[-1]) == [], "ENTRYPOINT [] (the pods set command:)"
    [cmd] = final.all("CMD")
    argv = exec_form(cmd)
    assert argv[0] in PYPROJECT["project"]["scripts"]
    # The broker CMD listens on the ports the image exposes.
    exposed = {p for e in final.all("EXPOSE") for p in e.args.split()}
    listen = argv[argv.index("--listen") + 1].rsplit(":", 1)[1]
    http = argv[argv.index("--http") + 1].rsplit(":", 1)[1]
    assert {listen, http} <= exposed


def test_copy_sources_exist_and_pass_dockerignore() -> None:
    _, all_stages = stages()
    copied: list[str] = []
    for stage in all_stages:
        for ins in stage.all("COPY") + stage.all("ADD"):
            assert ins.cmd == "COPY", "ADD fetches and unpacks implicitly; use COPY"
            if "from" in ins.flags:
                continue
            *sources, _dest = shlex.split(ins.args)
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert not ignored(src), f"COPY {src}: excluded by .dockerignore"
                copied.append(src.rstrip("/"))
    for path in (".venv", ".cache", ".git", "tests", ".cache/k8s/bin/helm", "bench"):
        assert ignored(path), f"{path} must stay out of the build context"
    assert not ignored("operator/handlers.py")
    assert not ignored("cli/main.py")  # the CLI, a folder of its own (straitmq.cli)
    assert ignored("straitmq/__pycache__/x.cpython-311.pyc")
    # Every package pyproject.toml declares is inside what the build stage copies.
    setup = PYPROJECT["tool"]["setuptools"]
    dirs = setup["package-dir"]
    for pkg in setup["packages"]:
        parent = max((p for p in dirs if pkg == p or pkg.startswith(p + ".")), key=len)
        rel = Path(dirs[parent], *pkg[len(parent) :].split(".")[1:])
        assert (ROOT / rel / "__init__.py").is_file(), f"package {pkg}: {rel}/__init__.py"
        assert any(rel.as_posix() == c or rel.as_posix().startswith(c + "/") for c in copied), (
            f"package {pkg} ({rel}) is not copied into the build stage"
        )
    assert "pyproject.toml" in copied


def test_every_console_script_exists() -> None:
    dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    scripts = PYPROJECT["project"]["scripts"]
    assert {"strait", "strait-broker", "strait-controller", "strait-operator"} <= set(scripts)
    for name, target in scripts.items():
        module, _, func = target.partition(":")
        parent = max((p for p in dirs if module == p or module.startswith(p + ".")), key=len)
        rel = Path(dirs[parent], *module[len(parent) :].split(".")[1:])
        path = ROOT / f"{rel}.py"
        if not path.exists():
            path = ROOT / rel / "__init__.py"
        assert path.is_file(), f"{name} = {target}: no {rel}.py"
        tree = ast.parse(path.read_text())
        funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert func in funcs, f"{name} = {target}: {path.relative_to(ROOT)} has no {func}()"


def test_every_package_folder_is_in_the_wheel() -> None:
    """The editable install maps whole folders, so a new subpackage imports in the
    .venv; the wheel (and so the image) holds only `packages`. A subpackage left out
    there breaks every pod with ModuleNotFoundError, which only the real-node tier saw."""
    setup = PYPROJECT["tool"]["setuptools"]
    listed = set(setup["packages"])
    found = set()
    for name, folder in setup["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_dependencies_come_from_the_lock_and_install_offline() -> None:
    _, all_stages = stages()
    build, final = all_stages
    build_runs = [i.args for i in build.all("RUN")]
    assert any("-r requirements.lock" in r and "--only-binary=:all:" in r for r in build_runs)
    final_runs = [i for i in final.all("RUN") if "pip install" in i.args]
    [install] = final_runs
    assert "--no-index" in install.args, "the runtime stage must not reach PyPI"
    assert "--constraint /requirements.lock" in install.args
    assert "source=/src/requirements.lock" in install.flags.get("mount", "")
    # No wheel cache or build tree left in the image: they come in through a bind mount.
    assert "type=bind,from=build,source=/wheels" in install.flags.get("mount", "")


def test_lock_pins_every_runtime_dependency_and_is_fresh() -> None:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"requirements.lock: {line!r} is not name==version"
            pins[name] = version
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} is missing from requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
    test_only = {"pytest", "ruff", "pyspark", "confluent-kafka"}
    assert not test_only & pins.keys(), "test dependencies do not belong in the image"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lock_requirements.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_build_backend_is_pinned_and_satisfies_pyproject() -> None:
    _, all_stages = stages()
    runs = " ".join(i.args for i in all_stages[0].all("RUN"))
    m = re.search(r"setuptools==([\w.]+)", runs)
    assert m, "pin setuptools in the build stage"
    for req in PYPROJECT["build-system"]["requires"]:
        r = Requirement(req)
        if r.name == "setuptools":
            assert r.specifier.contains(m[1])
    # PEP 639 license expressions (`license = "Apache-2.0"`) need setuptools 77+.
    assert SpecifierSet(">=77").contains(m[1])
    assert "--no-build-isolation" in runs, "build with the pinned backend, not a fresh one"


def test_runtime_tolerates_a_read_only_root_filesystem() -> None:
    _, all_stages = stages()
    env = " ".join(i.args for i in all_stages[-1].all("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env  # logs reach kubectl logs at once


def test_the_spark_jobs_image_holds_every_module_its_jobs_import(tmp_path: Path) -> None:
    """spark-jobs/k8s/Dockerfile copies a chosen few of straitmq's modules, not the wheel:
    lay out exactly what its COPY lines copy and import the jobs and the data source from
    that alone (a module the image lacks failed only in the driver pod before)."""
    spark_docker = ROOT / "spark-jobs" / "k8s" / "Dockerfile"
    image = tmp_path / "image"
    for line in spark_docker.read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        parts = shlex.split(line)
        if any(p.startswith("--") for p in parts):
            continue
        *sources, dest = parts[1:]
        for src in sources:
            if src.startswith(".cache/"):
                continue  # the jars: downloaded, not Python
            target = image / dest.lstrip("/")
            files = (
                [ROOT / src]
                if (ROOT / src).is_file()
                else [f for f in (ROOT / src).rglob("*.py") if "__pycache__" not in f.parts]
            )
            for f in files:
                rel = f.relative_to(ROOT / src) if (ROOT / src).is_dir() else None
                out = target / rel if rel is not None else target
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(f.read_bytes())
    # Its PYTHONPATH, and the jobs' folder, which each job puts first to import `common`.
    paths = [str(image / "opt" / "straitmq"), str(image / "opt" / "spark-jobs" / "jobs")]
    # The venv's editable install would quietly supply what the image lacks: every
    # straitmq module or job loaded must come from the image's files.
    code = (
        "import os, sys\n"
        "import straitmq.spark.source, straitmq.spark.options\n"
        "import common, topic_to_parquet, event_windows\n"
        "def where(m):\n"
        "    return getattr(m, '__file__', None) or next(iter(getattr(m, '__path__', [])), '')\n"
        "ours = ('straitmq', 'common', 'topic_to_parquet', 'event_windows')\n"
        "bad = [n for n, m in list(sys.modules.items())\n"
        "       if n.split('.')[0] in ours and not where(m).startswith(os.environ['IMAGE'])]\n"
        "assert not bad, f'not in the image: {bad}'\n"
    )
    r = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {paths!r}\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"IMAGE": str(image), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
