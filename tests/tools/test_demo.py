"""The README's first command runs the main job, examples/demo.py, and it ends with what each instance got."""

from __future__ import annotations

import re
import subprocess
import sys

from cgpu_testing.tools import ROOT


def test_the_readmes_first_command_runs_the_demo_to_its_summary() -> None:
    readme = (ROOT / "README.md").read_text()
    first = next(line.strip() for line in readme.splitlines() if line.startswith("    python3 -m venv"))
    script = first.rsplit(" ", 1)[-1]
    assert script == "examples/demo.py" and (ROOT / script).is_file()
    # as the README runs it: from the checkout's root, by path, with no PYTHONPATH
    env = {"PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, script, "--seconds", "4"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    assert "$ arbiterd --run-dir " in res.stdout and "cgpuctl: policy: 9 is out of range 0..5" in res.stdout
    assert re.search(r"work done b/a = [\d.]+ \(target 2.00\)", res.stdout), res.stdout
