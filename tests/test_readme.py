"""The README is a front page and the manual lives in docs/: the generated tables (verdicts,
flags, settings, metrics) match their one source of truth wherever they are, every command the
manual lists exists, every link between the pages resolves, and CI runs the README's two commands
in its order."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_README_BYTES = 20_000
MANUAL = ("commands", "metrics", "diagnosis-and-alerts", "ledger", "fleet", "security", "image", "benchmarks")


def _update_readme():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts/update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("relative", sorted(_update_readme().FILES))
def test_generated_tables_are_current(relative):
    text, fresh = _update_readme().render_file(relative)
    assert fresh == text, f"{relative} is stale; run: .venv/bin/python scripts/update_readme.py"


def test_each_generated_table_lives_in_one_file():
    found: dict[str, list[str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"<!-- ([\w-]+):begin", path.read_text()):
            found.setdefault(name, []).append(path.name)
    assert {name: files for name, files in found.items() if len(files) > 1} == {}
    assert set(found) == {name for names in _update_readme().FILES.values() for name in names}


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= MAX_README_BYTES, len(text.encode())
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Try it (no GPU needed)", "Deploy", "What it says", "Read more"], headings
    assert "![" in text.split("## ")[0], "the picture comes before the first section"
    deploy = text.split("## Deploy")[1].split("## ")[0]
    helm = re.search(r"helm install[^`]*?(?=\n```)", deploy, re.S)
    assert helm and len(helm.group(0).splitlines()) <= 5, "helm in five lines"
    for page in MANUAL:
        assert f"(docs/{page}.md)" in text, page


def test_the_readme_states_the_time_to_the_first_verdict():
    text = (ROOT / "README.md").read_text()
    assert re.search(r"From `git clone` to the\s+first verdict took \*\*\d+ s\*\*", text), "the measured figure"


def test_every_link_between_the_pages_resolves():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve()
            assert resolved.exists(), f"{path.name}: {target}"
            if anchor and resolved.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)}
                assert anchor in slugs, f"{path.name}: {target} (anchors: {sorted(slugs)})"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_command_in_the_manual_table_exists():
    from kvdoctor.cli import build_parser

    text = (ROOT / "docs/commands.md").read_text()
    choices = build_parser()._subparsers._group_actions[0].choices
    listed = [line.split("`")[1].split()[1] for line in text.splitlines() if line.startswith("| `kvdoctor ")]
    assert set(listed) == set(choices), set(choices) ^ set(listed)


def test_ci_runs_the_readme_commands_in_its_order():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n(.*?)\n```", readme, re.S)
    assert first and first.group(1).endswith("make demo") and first.group(2) == "make test"
    lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    demo = next(i for i, line in enumerate(lines) if "demo-check" in line and line.lstrip().startswith(("env", "make")))
    assert "git clone" in "\n".join(lines[:demo]), "the demo runs on a clean clone"
    assert lines[-1].strip().endswith("make test") and demo < len(lines) - 1


def test_make_demo_installs_what_the_demo_serves():
    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: (.+)$", makefile, re.M)
    assert demo and ".kvdoctor-demo" in demo.group(1)
    stamp = re.search(r"^\$\(VENV\)/\.kvdoctor-demo: .*\n\t(.+)$", makefile, re.M)
    assert stamp and stamp.group(1).strip() == "bash scripts/setup.sh --dashboard"
    assert '--dashboard) extras="[dashboard]"' in (ROOT / "scripts/setup.sh").read_text()
    assert re.search(r"^demo-check: .*\n\t.*kvdoctor demo --check", makefile, re.M)
