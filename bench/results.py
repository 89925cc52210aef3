"""Write a benchmark's section of bench/RESULTS.md (between its own markers), keeping the others."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = "# Benchmark results\n\nEvery number here was measured by the command shown above it.\n"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024**2:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, no GPU"


def update(name: str, command: str, body: str, on: str | None = None) -> None:
    """Replace the section ``name`` of RESULTS.md with ``body`` and its command, date and machine (``on``: the
    machine it was measured on, where that is not this one)."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"{begin}\n```\n{command}\n```\nMeasured {when} on {on or machine()}.\n\n{body.rstrip()}\n{end}")
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    RESULTS.write_text(text)
