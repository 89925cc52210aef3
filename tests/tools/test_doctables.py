"""The documents' tables of flags, keys and tree files are generated from the settings' declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arbiterd.core.settings import GPU, INSTANCE
from arbiterd.server import config
from cgpu_device_plugin import config as plugin_config
from docgen import tables as doctables


def test_the_committed_tables_are_what_the_generator_writes() -> None:
    assert doctables.stale() == [], f"regenerate them: {doctables.COMMAND}"


@pytest.mark.parametrize("table", doctables.TABLES, ids=lambda t: f"{t.doc}:{t.name}")
def test_every_table_has_its_markers(table: doctables.Table) -> None:
    text = (doctables.ROOT / table.doc).read_text()
    assert text.count(f"<!-- BEGIN {table.name}:") == 1 and text.count(f"<!-- END {table.name} -->") == 1


def _rows(table: str, key_first: bool = False) -> dict[str, list[str]]:
    """The rows of a generated table by the code span naming them (the key or the path)."""
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        keys = re.findall(r"`([^`]+)`", cells[0])
        out[keys[0] if key_first else keys[-1]] = cells
    return out


def test_every_flag_and_key_has_its_range_and_default() -> None:
    rows = _rows(doctables.arbiterd_flags())
    for s in config.SETTINGS:
        value, default = rows[s.name][1:3]
        assert value == s.expected.replace("<", "\\<")
        assert default == (f"`{s.shown(s.default)}`" if s.default is not None else "—")
    plugin = _rows(doctables.plugin_flags(), key_first=True)
    for s in plugin_config.SETTINGS.values():
        assert plugin[s.name][0].startswith(f"`{s.name}` (`--")
        assert plugin[s.name][1:3] == [s.expected, f"`{s.shown(s.default)}`"]


def test_every_tree_setting_has_its_range_and_default() -> None:
    rows = _rows(doctables.tree())
    for name, s in GPU.items():
        assert rows[f"N/{name}"][1:4] == ["rw", s.expected, f"`{s.format(s.default)}`"]
    for name, s in INSTANCE.items():
        if s.tree:
            assert rows[f"N/ID/{name}"][1:4] == ["rw", s.expected, f"`{s.format(s.default)}`"]
    assert rows["N/free_weight"][1] == "ro" and rows["version"][1] == "ro"


def test_a_stale_table_is_found_and_rewritten(tmp_path: Path) -> None:
    for doc in {t.doc for t in doctables.TABLES}:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / doc).write_text((doctables.ROOT / doc).read_text())
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("`--max-clients N` (`max_clients`) | an integer 1..100000 | `1024`",
                                                 "`--max-clients N` (`max_clients`) | an integer 1..100000 | `512`"))
    assert doctables.stale(tmp_path) == ["README.md: arbiterd-flags"]
    assert doctables.write(tmp_path) == ["README.md"]
    assert doctables.stale(tmp_path) == []


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(KeyError, match="no <!-- BEGIN tree -->"):
        doctables.rewrite("no tables here\n", doctables.TABLES[1])
