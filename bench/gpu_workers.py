"""The tenants bench.gpu's framework parts run, and what each one did.

A :class:`PyWorker` is ``python -m bench.fw_worker`` (its protocol: that module's docstring) in a process group of
its own, its stdout read by a thread (a line it waits for has a deadline), its stderr kept in a file. A
:class:`CWorker` is the CUDA job program (``cgpu_testing/native/cuda_job.c``), the stand-in where a framework is
missing (the fake driver): its windows are ``spin`` actions, fixed when it starts. Both give a :class:`Done`,
whose :meth:`Done.rate` is the units a second a tenant did inside a window.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_host import rows

Span = tuple[int, int]


@dataclass
class Done:
    """What one tenant did: per window of its plan, either its steps' (start, end) or, for the CUDA job program,
    its totals."""

    unit: str
    per_step: dict[str, float]
    steps: dict[str, list[Span]] = field(default_factory=dict)  # variant -> (start, end) of each step, in order
    totals: list[tuple[float, int, int]] = field(default_factory=list)  # cuda_job: (units, first, last) a window

    def rate(self, variant: str, window: Span, index: int = 0) -> float | None:
        """Units a second over ``window``: the work between the first and the last step that ended inside it (so
        no partial step is counted); None with fewer than three such steps. For the CUDA job program, its
        ``index``-th window's own count."""
        if self.totals:
            units, first, last = self.totals[index]
            return units / ((last - first) / 1e9) if last > first else None
        ends = [e for _, e in self.steps.get(variant, []) if window[0] <= e <= window[1]]
        if len(ends) < 3:
            return None
        return self.per_step[variant] * (len(ends) - 1) / ((ends[-1] - ends[0]) / 1e9)


class WorkerError(RuntimeError):
    """A tenant that did not start, or broke: one line, with the end of its stderr."""


class PyWorker:
    """``python -m bench.fw_worker`` (under ``prefix``, e.g. ``cgpu-run ... --``), started at once."""

    def __init__(self, name: str, prefix: list[str], workload: str, args: list[str], env: dict[str, str],
                 tmp: Path, cwd: Path) -> None:
        import sys

        self.name = name
        self.out = tmp / f"{name}.json"
        self.err_path = tmp / f"{name}.err"
        self.info: dict[str, Any] = {}
        cmd = [*prefix, sys.executable, "-m", "bench.fw_worker", workload, "--out", str(self.out), *args]
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr(self) -> str:
        try:
            return self.err_path.read_text()
        except OSError as exc:
            return f"(its stderr cannot be read: {exc.strerror})"

    def stderr_tail(self) -> str:
        try:
            lines = [x for x in self.err_path.read_text().splitlines() if x.strip()]
        except OSError:
            return ""
        return lines[-1][-300:] if lines else ""

    def wait_for(self, word: str, deadline: float) -> str:
        """The rest of the first stdout line that starts with ``word`` (others are the framework's own chatter)."""
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise WorkerError(f"{self.name}: no '{word}' within its time (stderr: {self.stderr_tail()!r})"
                                  ) from None
            if line is None:
                self.proc.wait()
                raise WorkerError(f"{self.name} exited with {self.proc.returncode} before '{word}': "
                                  f"{self.stderr_tail()}")
            if line == word or line.startswith(word + " "):
                return line[len(word):].strip()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"{self.name} is gone: {self.stderr_tail()}") from None

    def init(self) -> None:
        self.send("init")

    def ready(self, deadline: float) -> dict[str, Any]:
        self.info = json.loads(self.wait_for("ready", deadline))
        return self.info

    def go(self, plan: list[tuple[str, int, int]]) -> None:
        self.send(json.dumps([list(w) for w in plan]))

    def done(self, deadline: float) -> Done:
        self.wait_for("done", deadline)
        self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        doc = json.loads(self.out.read_text())
        variants = self.info["variants"]
        steps: dict[str, list[Span]] = {n: [] for n in doc["variants"]}
        for vi, t0, t1 in doc["steps"]:
            steps[doc["variants"][vi]].append((t0, t1))
        unit = next(iter(variants.values()))["unit"] if variants else "units"
        return Done(unit, {n: v["per_step"] for n, v in variants.items()}, steps)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def keep_stderr(proof: Any, workers: list[Any]) -> str:
    """The Python tenants' stderr kept in the proof's workers.log (bench.gpu's ``Proof.log``); its name, or ''."""
    kept = [proof.log(w.name, w.stderr()) for w in workers if isinstance(w, PyWorker)]
    return kept[-1].name if kept else ""


class CWorker:
    """The CUDA job program running ``batch`` kernels of ``kernel_ms`` (a sync after each batch) in each window of
    ``plan``, as one graph per batch with ``graph`` (``cuGraphLaunch``); its work is kernel-ms."""

    def __init__(self, name: str, job: Path, prefix: list[str], env: dict[str, str], plan: list[Span],
                 kernel_ms: float, batch: int, graph: bool) -> None:
        self.name = name
        api = ["--api", "graph"] if graph else []
        spins = [f"spin={kernel_ms},{batch},{s},{e}" for s, e in plan]
        self.proc = subprocess.Popen([*prefix, str(job), *api, *spins], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.info: dict[str, Any] = {"pid": self.proc.pid, "shim": "LD_PRELOAD" in env or bool(prefix)}

    def done(self, deadline: float) -> Done:
        try:
            out, err = self.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise WorkerError(f"{self.name}: the CUDA job program ran past its time") from None
        if self.proc.returncode != 0:
            raise WorkerError(f"{self.name}: cuda_job exited with {self.proc.returncode}: {err.strip()[-300:]}")
        spins = [r for r in rows(out) if r["name"] == "spin"]
        return Done("kernel-ms", {}, totals=[(int(r["kernel_ns"]) / 1e6, int(r["first"]), int(r["last"]))
                                             for r in spins])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
