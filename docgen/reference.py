"""The reference the man pages and the documents' tables are made from: a program's flags and config keys,
and the files of the settings tree, each row drawn from its setting's declaration."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from arbiterd.core.setting import Setting
from arbiterd.core.settings import GLOBAL, GPU, INSTANCE
from arbiterd.core.tree import ALLOC_FILES, GLOBAL_FILES, GPU_FILES, GPU_READONLY, INST_FILES, INSTANCE_READONLY

# the files of the tree that are neither settings nor computed values
CONTROL_FILES = {
    "version": "the daemon's version",
    "inst_ctl": "provision instance records: create ID [gpu=0,1] [weight=N | core=P] [limit=P] [highprio=0|1] "
                "[memsize=SIZE] [uid=N], or remove ID [gpu=N]; uid=N: an instance for host processes of uid N "
                "(no container and no other uid may use it); reading lists the provisioned records",
    "alloc_ctl": "Kubernetes allocations, listed while allocations is not off: create ID token=SHA256 gpu=I[,J] "
                 "[memsize=SIZE[,SIZE]] [core=P | weight=N] [limit=P] [highprio=0|1] [namespace=NS pod=NAME "
                 "[container=NAME]], label ID namespace=NS pod=NAME [container=NAME] (the pod of the container it "
                 "is for, as Kubernetes names it), limit ID P|none (its ceiling, from the pod's cgpu.io/core-limit "
                 "annotation), or remove ID (409 when a card's memory or 100 % of its core "
                 "would be overcommitted); reading lists ID gpu=... memsize=... core=P [limit=P] [namespace=... "
                 "pod=... container=...] bound=<container|->",
}


@dataclass(frozen=True)
class Entry:
    """One row: a flag or config key, or a file of the tree; ``setting`` is None for the rest."""

    name: str  # the file's path (N/ and N/ID/ for a GPU's and an instance's), or the setting's name
    help: str
    setting: Setting[Any] | None = None
    flags: tuple[str, ...] = ()  # the flags, as written with their argument (--run-dir DIR)

    @property
    def writable(self) -> bool:
        return self.setting is not None or self.name in ("inst_ctl", "alloc_ctl")

    @property
    def expected(self) -> str:
        return self.setting.expected if self.setting is not None else ""

    @property
    def default(self) -> str:
        s = self.setting
        return s.shown(s.default) if s is not None else ""

    @property
    def meaning(self) -> str:
        restart = self.setting is not None and self.setting.restart
        return self.help + ("; takes effect at the next start" if restart else "")


def tree_files() -> list[Entry]:
    """Every file of the tree, in the order ``ls`` lists them: the node's, then a GPU's (``N/``), then an
    instance's (``N/ID/``)."""
    out = []
    for name in (*GLOBAL_FILES, *ALLOC_FILES):
        s = GLOBAL.get(name)
        out.append(Entry(name, s.help if s is not None else CONTROL_FILES[name], s))
    for name in GPU_FILES:
        out.append(Entry(f"N/{name}", GPU[name].help, GPU[name]) if name in GPU
                   else Entry(f"N/{name}", GPU_READONLY[name][1]))
    for name in INST_FILES:
        out.append(Entry(f"N/ID/{name}", INSTANCE[name].help, INSTANCE[name]) if name in INSTANCE
                   else Entry(f"N/ID/{name}", INSTANCE_READONLY[name][1]))
    return out


def _written(action: argparse.Action) -> tuple[str, ...]:
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        return tuple(action.option_strings)
    metavar = action.metavar or (None if action.choices else action.dest.upper())
    return tuple(f"{o} {metavar}" if metavar else o for o in action.option_strings)


def options(parser: argparse.ArgumentParser, settings: Iterable[Setting[Any]]) -> list[Entry]:
    """A program's flags and config keys: the flags that are not settings (``--config``), then every setting
    that is a flag or a key, in the order declared."""
    declared = {s.name: s for s in settings if s.flag or s.toml}
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    out = [Entry(a.option_strings[0], a.help or "", None, _written(a))
           for dest, a in actions.items() if dest not in declared and dest != "version"]
    for name, s in declared.items():
        out.append(Entry(name, s.help, s, _written(actions[name]) if s.flag else ()))
    if "version" in actions:
        out.append(Entry("--version", "print the program's version and exit", None, ("--version",)))
    return out
