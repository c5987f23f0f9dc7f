"""The design the code follows lives in the repository: every document a source comment or a
doc page cites is a file of the repository's own ``docs/``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tracer", "engine", "collectors", "analysis", "reports", "benchmarks", "tests")
CITED = re.compile(r"\bdocs/([\w.-]+\.md)\b")


def _sources() -> list[Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
             if p.suffix in {".py", ".toml"} and "__pycache__" not in p.parts]
    return files + [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_cited_doc_is_in_the_repository():
    missing = {}
    for path in _sources():
        for name in CITED.findall(path.read_text(encoding="utf-8")):
            if not (ROOT / "docs" / name).is_file():
                missing.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert missing == {}


def test_no_source_cites_a_design_file_outside_the_repository():
    # The design once lived beside the repository as DESIGN.md; it is docs/design.md now.
    citing = [p.relative_to(ROOT).as_posix() for p in _sources()
              if p != Path(__file__).resolve()
              and re.search(r"(?<![\w/])DESIGN(\.md)?\b", p.read_text(encoding="utf-8"))]
    assert citing == []


def test_the_design_names_the_code_s_stages_and_outcomes():
    from ttft.tracer.schema import OUTCOMES, STAGES

    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert [s.name for s in STAGES if f"`{s.name}`" not in design] == []
    assert [o for o in OUTCOMES if f"`{o}`" not in design] == []
