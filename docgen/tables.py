"""The documents' reference tables, generated from the settings' declarations.

    python -m docgen.tables           # rewrite every table in README.md and docs/
    python -m docgen.tables --check   # exit 1 naming each table that is stale

Each table stands in its document between ``<!-- BEGIN name ... -->`` and
``<!-- END name -->``; the text around it is the document's own. The flags and
keys of ``arbiterd``, ``cgpu-device-plugin`` and ``cgpu-dra-plugin`` and the files of the settings
tree are all tables here, so a name, a range or a default written in a
document is the one the code checks; a test fails when a committed table is
not what this writes.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from docgen.reference import Entry, options, tree_files

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m docgen.tables"


def _text(text: str) -> str:
    """Plain text in a table cell: the pipe and the angle bracket escaped."""
    return text.replace("|", "\\|").replace("<", "\\<")


def _code(text: str) -> str:
    escaped = text.replace("|", "\\|")
    return f"`{escaped}`" if text else "—"


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(head: list[str], rows: Iterable[list[str]]) -> str:
    return "\n".join([_row(head), _row(["---"] * len(head)), *(_row(r) for r in rows)])


def _key_and_flags(e: Entry, key_first: bool) -> str:
    flags = ", ".join(_code(f) for f in e.flags)
    if e.setting is None or not e.setting.toml:
        return flags
    key = _code(e.name)
    if key_first:
        return f"{key} ({flags})" if flags else key
    return f"{flags} ({key})" if flags else f"({key})"


def _option_rows(entries: list[Entry], key_first: bool) -> list[list[str]]:
    return [[_key_and_flags(e, key_first), _text(e.expected) or "—", _code(e.default), _text(e.meaning)]
            for e in entries]


def arbiterd_flags() -> str:
    from arbiterd.main import build_parser
    from arbiterd.server.config import SETTINGS

    rows = _option_rows(options(build_parser(), SETTINGS), key_first=False)
    return _table(["flag (TOML key)", "value", "default", "meaning"], rows)


def plugin_flags() -> str:
    from cgpu_device_plugin.config import SETTINGS
    from cgpu_device_plugin.main import build_parser

    entries = [e for e in options(build_parser(), SETTINGS.values()) if e.setting is not None]
    return _table(["key (flag)", "value", "default", "meaning"], _option_rows(entries, key_first=True))


def dra_plugin_flags() -> str:
    """cgpu-dra-plugin's flags, from its parser (it has no config file: the DaemonSet passes flags)."""
    from cgpu_dra_plugin.main import build_parser

    rows = []
    for a in build_parser()._actions:
        if not a.option_strings or a.dest in ("help", "version"):
            continue
        flag = a.option_strings[-1] + (f" {a.metavar or a.dest.upper()}" if a.nargs != 0 and not a.choices else "")
        value = "one of " + ", ".join(map(str, a.choices)) if a.choices else "seconds" if a.type is float else "—"
        default = "$NODE_NAME" if a.dest == "node_name" else "" if a.default is None else str(a.default)
        rows.append([_code(flag), _text(value), _code(default), _text((a.help or "").split(" (default")[0])])
    return _table(["flag", "value", "default", "meaning"], rows)


def _tree_rows(prefix: str, strip: bool) -> list[list[str]]:
    rows = []
    for e in tree_files():
        rest = e.name[len(prefix):] if e.name.startswith(prefix) else None
        if rest is None or "/" in rest:
            continue
        rows.append([_code(rest if strip else e.name), "rw" if e.writable else "ro", _text(e.expected) or "—",
                     _code(e.default), _text(e.meaning)])
    return rows


def tree() -> str:
    rows = _tree_rows("", False) + _tree_rows("N/", False) + _tree_rows("N/ID/", False)
    return _table(["path", "rw", "value", "default", "meaning"], rows)


def tree_part(prefix: str) -> Callable[[], str]:
    return lambda: _table(["file", "rw", "value", "default", "meaning"], _tree_rows(prefix, True))


@dataclass(frozen=True)
class Table:
    doc: str  # relative to the repository root
    name: str
    render: Callable[[], str]


TABLES = (
    Table("README.md", "arbiterd-flags", arbiterd_flags),
    Table("README.md", "tree", tree),
    Table("docs/behaviour.md", "tree-node", tree_part("")),
    Table("docs/behaviour.md", "tree-gpu", tree_part("N/")),
    Table("docs/behaviour.md", "tree-instance", tree_part("N/ID/")),
    Table("docs/kubernetes.md", "plugin-flags", plugin_flags),
    Table("docs/kubernetes.md", "dra-plugin-flags", dra_plugin_flags),
)


def _span(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- BEGIN {re.escape(name)}\b[^>]*-->\n)(.*?)(<!-- END {re.escape(name)} -->)", re.S)


def rewrite(text: str, table: Table) -> str:
    """``text`` with ``table`` rewritten between its markers; KeyError when the markers are missing."""
    m = _span(table.name).search(text)
    if m is None:
        raise KeyError(f"{table.doc}: no <!-- BEGIN {table.name} --> ... <!-- END {table.name} --> markers")
    return text[:m.start(2)] + table.render() + "\n" + text[m.end(2):]


def stale(root: Path = ROOT) -> list[str]:
    """``doc: name`` for each table whose committed text is not what :func:`rewrite` writes."""
    out = []
    for t in TABLES:
        text = (root / t.doc).read_text()
        if rewrite(text, t) != text:
            out.append(f"{t.doc}: {t.name}")
    return out


def write(root: Path = ROOT) -> list[str]:
    """Rewrite every table; the documents that changed."""
    changed = []
    for doc in dict.fromkeys(t.doc for t in TABLES):
        path = root / doc
        before = text = path.read_text()
        for t in TABLES:
            if t.doc == doc:
                text = rewrite(text, t)
        if text != before:
            path.write_text(text)
            changed.append(doc)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Generate the documents' tables from the settings.")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale table")
    args = p.parse_args(argv)
    if not args.check:
        for doc in write():
            print(doc)
        return 0
    old = stale()
    print("".join(f"{line} is stale: {COMMAND}\n" for line in old), end="")
    return int(bool(old))


if __name__ == "__main__":
    sys.exit(main())
