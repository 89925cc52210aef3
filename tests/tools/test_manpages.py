"""The man pages are generated from the tools' parsers and the settings and environment tables."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from arbiterd.core.settings import GPU, INSTANCE
from docgen.manpages import PAGES, write
from libcgpu_client.env import VARIABLES

ROOT = Path(__file__).resolve().parent.parent.parent


def test_committed_pages_are_what_the_generator_writes(tmp_path: Path) -> None:
    for path in write(tmp_path):
        assert (ROOT / "man" / path.name).read_text() == path.read_text(), \
            f"man/{path.name} is stale: python -m docgen.manpages man"


def test_every_flag_setting_and_variable_is_documented() -> None:
    pages = {p.name: p.render() for p in PAGES}
    for page in PAGES:
        for action in page.parser()._actions:
            for opt in action.option_strings:
                assert opt.replace("-", "\\-") in pages[page.name], (page.name, opt)
    for name in [*GPU, *(n for n, s in INSTANCE.items() if s.tree)]:
        assert name in pages["arbiterd"] and name in pages["cgpuctl"], name
    for var in VARIABLES:
        assert var in pages["cgpu-run"], var


@pytest.mark.parametrize("page", [f"{p.name}.{p.section}" for p in PAGES])
def test_pages_render_without_warnings(page: str) -> None:
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(ROOT / "man" / page)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
