"""The repository's documents point only at files a clone has.

Over the files git tracks (or would track: new, not ignored), for every Markdown page:
- no page, and no Python file, names a path under a `shared` folder beside the checkout
  (`../shared/...`): no clone has it;
- every relative Markdown link `[text](path)` (or `[ref]: path`) outside code resolves to a file or
  folder inside the repository (web links, other schemes and pure `#anchor` links are skipped; a
  `#anchor` suffix is stripped).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a path under the folder beside the checkout, written relative to the repository
OUTSIDE = re.compile(r"\.\.[/\\]+shared[/\\]")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[(?!\^)[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def repository_files() -> list[Path]:
    """Files git tracks plus new ones it does not ignore; without git, a plain walk."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
        ).stdout
        files = [ROOT / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "node_modules", "__pycache__"}
        files = [p for p in ROOT.rglob("*")
                 if not skip & set(p.relative_to(ROOT).parts) and "egg-info" not in str(p)]
    return sorted(p for p in set(files) if p.is_file())


def markdown_pages(files: list[Path]) -> list[Path]:
    return [p for p in files if p.suffix == ".md"]


def names_outside(text: str) -> list[str]:
    """The lines of `text` that name a path under ../shared/."""
    return [line.strip() for line in text.splitlines() if OUTSIDE.search(line)]


def link_targets(text: str) -> list[str]:
    """Targets of the inline and reference links of a Markdown text, outside code."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def broken_links(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """Relative link targets of `page` that are not a file or folder inside `root`."""
    broken = []
    for target in link_targets(text):
        if target.startswith("#") or target.startswith("//") or SCHEME.match(target):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not path:
            continue
        resolved = (root / path.lstrip("/")) if path.startswith("/") else page.parent / path
        resolved = resolved.resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            broken.append(target)
    return broken


FILES = repository_files()
PAGES = markdown_pages(FILES)
PYTHON = [p for p in FILES if p.suffix == ".py" and p != Path(__file__).resolve()]


def test_the_pages_are_found():
    found = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert "README.md" in found
    assert PYTHON


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_names_nothing_outside_the_repository(page):
    assert names_outside(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_links_resolve_inside_the_repository(page):
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_python_files_name_nothing_outside_the_repository():
    hits = {p.relative_to(ROOT).as_posix(): lines for p in PYTHON
            if (lines := names_outside(p.read_text(encoding="utf-8", errors="replace")))}
    assert hits == {}


# -- the checks themselves, on literal cases ------------------------------------------------------

def test_a_path_beside_the_checkout_is_caught():
    assert names_outside("See `../shared/DESIGN.md` for the architecture.")
    assert names_outside('"""Spec: ../shared/POLICIES.md §3."""')
    assert not names_outside("See [docs/design.md](docs/design.md); shared/ memory is not a path.")


def test_links_are_resolved_against_the_page(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("x")
    page = tmp_path / "README.md"
    text = ("[design](docs/design.md#data-flow) [web](https://example.com/a.md) [top](#usage) "
            "[mail](mailto:a@b.c) [gone](docs/missing.md) [out](../shared/DESIGN.md)\n"
            "`[code](not/a/link.md)`\n```\n[fenced](also/not.md)\n```\n[ref]: docs/nope.md\n")
    assert broken_links(page, text, tmp_path) == ["docs/missing.md", "../shared/DESIGN.md",
                                                  "docs/nope.md"]
    inner = tmp_path / "docs" / "index.md"
    assert broken_links(inner, "[up](../README.md) [self](design.md)", tmp_path) == [
        "../README.md"]
    page.write_text("x")
    assert broken_links(inner, "[up](../README.md) [self](design.md)", tmp_path) == []
