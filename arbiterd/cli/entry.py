"""The start of every program's ``main``: ``--check-config``, the config with the flags over it, logging."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from arbiterd.core.errors import SettingError

LOG_LEVELS = ("debug", "info", "warning", "error")  # every program's log_level
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Logged(Protocol):
    log_level: str


C = TypeVar("C", bound=Logged)


def check_config(path: str, check_file: Callable[[str], list[str]]) -> int:
    """``--check-config``: print each error on its own line and return 1, or print ``PATH: ok`` and return 0."""
    errors = check_file(path)
    for err in errors:
        print(err)
    if not errors:
        print(f"{path}: ok")
    return 1 if errors else 0


def configure(prog: str, args: argparse.Namespace, check_file: Callable[[str], list[str]],
              load: Callable[[str | None, dict[str, Any]], C], flags: dict[str, Any]) -> C | int:
    """The config ``main`` runs with (the file, then ``flags`` over it), with logging set up at its
    ``log_level``; or the exit status when there is nothing to run: ``--check-config``'s, or 2 when a setting
    is refused (each line of the reason printed as ``prog: reason``)."""
    if args.check_config:
        return check_config(args.check_config, check_file)
    try:
        cfg = load(args.config, flags)
    except SettingError as exc:
        for line in str(exc).splitlines():
            print(f"{prog}: {line}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    return cfg
