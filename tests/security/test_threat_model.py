"""SECURITY.md's table names, for each attack, the test that shows the defence: every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REF = re.compile(r"`((?:tests/[\w/]+/)?(test_\w+\.py))?(?:::(\w+))?`")


def test_every_test_the_threat_model_names_exists() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(table) >= 20
    files = {p.name: p for p in (ROOT / "tests").rglob("test_*.py")}
    missing = []
    for line in table:
        current: Path | None = None
        for m in REF.finditer(line.rsplit("|", 2)[-2]):  # the last column: "shown by"
            path, name, func = m.group(1), m.group(2), m.group(3)
            if name:
                current = ROOT / path if path and "/" in path else files.get(name)
                if current is None or not current.exists():
                    missing.append(path or name)
                    continue
            if func and (current is None or f"def {func}(" not in current.read_text()):
                missing.append(f"{current}::{func}")
    assert missing == []
