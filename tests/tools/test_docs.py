"""The documents are reference: README's performance table has one row per benchmark, with its figure, its
settings and a link to its history in bench/RESULTS.md; the history is there, not in the reference documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "bench" / "RESULTS.md").read_text()
REFERENCE = ("README.md", "docs/behaviour.md", "docs/tuning.md", "docs/kubernetes.md", "bench/README.md")


def benchmarks() -> list[str]:
    """Every bench module that runs as a program and writes its section of RESULTS.md."""
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py")
                  if "__main__" in (text := p.read_text()) and "from bench import results" in text)


def performance_rows() -> list[str]:
    section = README.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `python -m bench.")]


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_one_performance_row_per_benchmark() -> None:
    named = [m.group(1) for row in performance_rows() if (m := re.match(r"\| `python -m bench\.(\w+)", row))]
    assert sorted(named) == benchmarks()


@pytest.mark.parametrize("row", performance_rows(), ids=lambda r: r.split("`")[1])
def test_a_row_is_a_figure_its_settings_and_a_link_to_its_history(row: str) -> None:
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert len(cells) == 5 and all(cells), row
    headings = {anchor(h) for h in re.findall(r"^## (.+)$", RESULTS, re.M)}
    links = re.findall(r"\(bench/RESULTS\.md#([\w-]+)\)", cells[4])
    assert links and all(link in headings for link in links), (links, sorted(headings))
    # no history in the row: no commit, no "the run before", no comparison with earlier code
    assert not re.search(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", row), row
    assert not re.search(r"\bbefore\b|\bthe run\b|\bearlier\b|\bnow\b", row, re.I), row


def test_every_results_section_sits_under_a_benchmark_heading() -> None:
    for name in re.findall(r"^<!-- BEGIN ([\w-]+) -->$", RESULTS, re.M):
        above = RESULTS[:RESULTS.index(f"<!-- BEGIN {name} -->")]
        assert re.search(r"^## ", above, re.M), name


@pytest.mark.parametrize("doc", REFERENCE)
def test_reference_documents_carry_no_dates_and_no_internal_sources(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), "dated history belongs in bench/RESULTS.md"
    assert not re.findall(r"\bseeds? \d{3}\b|founding notes|\bthe spec\b", text, re.I)


def test_tuning_is_a_short_account() -> None:
    text = (ROOT / "docs" / "tuning.md").read_text()
    assert len(text.splitlines()) <= 150
    for name in ("slice_ms", "handover_target_pct", "slice_min_ms", "slice_max_ms", "transit", "warm-up",
                 "credit"):
        assert name in text, name
