"""The docs' code runs: every ```python block of a page, the quickstart, the figures, the site."""
import importlib.util
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(p for p in DOCS.rglob("*.md") if BLOCK.search(p.read_text()))


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(first line number, code) of each ```python block, leaving out snippet includes."""
    text = page.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        code = match.group(1)
        if not code.lstrip().startswith("--8<--"):
            blocks.append((text.count("\n", 0, match.start(1)), code))
    return blocks


def test_every_howto_page_has_snippets():
    howtos = sorted((DOCS / "howto").glob("*.md"))
    assert howtos and all(python_blocks(p) for p in howtos)


HOWTOS = sorted((DOCS / "howto").glob("*.md"))


@pytest.mark.parametrize("page", HOWTOS, ids=[p.name for p in HOWTOS])
def test_howto_opens_with_its_shortest_example(page):
    """A how-to opens API-first: a sentence or two, the shortest code that works, the keys.

    All before its first ``##`` section. The block runs as written: test_page_snippets_run
    runs a page's blocks in order from an empty namespace, so the first one runs alone.
    """
    text = page.read_text()
    section = re.search(r"^## ", text, re.M)
    opening = text[: section.start() if section else len(text)]
    first = BLOCK.search(text)
    assert first is not None and first.end() <= len(opening), "the first ```python block comes before any ## section"
    intro = [line for line in text[: first.start()].splitlines()[1:] if line.strip()]
    assert intro and len(intro) <= 6 and not any(line.startswith("```") for line in intro), (
        "one or two sentences of what it is, then the code"
    )
    assert len([line for line in first.group(1).splitlines() if line.strip()]) <= 35, "the first block is the short one"
    assert re.search(r"^\|.*\|$", opening[first.end():], re.M), "a table of the keys it reads and writes follows the block"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_snippets_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    for first_line, code in python_blocks(page):
        # pad with blank lines so that tracebacks point at the line in the page
        exec(compile("\n" * first_line + code, str(page), "exec"), namespace)


def test_quickstart_runs_and_trains():
    namespace = runpy.run_path(str(DOCS / "quickstart.py"))
    assert namespace["chunk"].batch_size == (4, 16)
    assert namespace["loss"].item() > 0
    # a 16-line quickstart (the last prints what it trained on), pasted into the README
    assert len([l for l in (DOCS / "quickstart.py").read_text().splitlines() if l.strip()]) <= 16


def test_index_includes_the_quickstart():
    assert '--8<-- "docs/quickstart.py"' in (DOCS / "index.md").read_text()


def test_figures_are_generated(tmp_path):
    spec = importlib.util.spec_from_file_location("make_figures", DOCS / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path)
    for name in ("streams", "carry", "window_counts"):
        assert (tmp_path / f"{name}.png").stat().st_size > 5000
        assert (DOCS / "img" / f"{name}.png").exists(), "commit the figures: python docs/make_figures.py"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed")
def test_mkdocs_build_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "concepts" / "index.html").exists()


def test_api_page_documents_every_public_name():
    import torchrl_seqchunk

    documented = set(re.findall(r"^::: torchrl_seqchunk\.[\w.]+\.(\w+)$", (DOCS / "api.md").read_text(), re.M))
    assert sorted(set(torchrl_seqchunk.__all__) - documented) == []
