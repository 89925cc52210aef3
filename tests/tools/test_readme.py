"""The README documents every flag of every tool, every environment variable and every tree file."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiterd.core.tree import GPU_FILES, INST_FILES
from docgen.manpages import PAGES
from libcgpu_client.env import VARIABLES

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_is_in_the_readme(page: object) -> None:
    parser = page.parser()  # type: ignore[attr-defined]
    missing = [o for a in parser._actions for o in a.option_strings
               if o not in ("-h", "--help", "--version") and o not in README]
    assert missing == []


def test_every_variable_and_tree_file_is_in_the_readme() -> None:
    assert [v for v in VARIABLES if f"`{v}`" not in README] == []
    assert [f for f in GPU_FILES if f"N/{f}" not in README] == []
    assert [f for f in INST_FILES if f"N/ID/{f}" not in README] == []
