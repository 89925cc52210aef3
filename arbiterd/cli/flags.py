"""Command-line flags made from settings: ``--<name with dashes>``, with the setting's help, default and check.

A flag's value is checked where the file's is (:mod:`arbiterd.cli.configfile`), so a bad value gets the
same one-line message on the command line as in the file. Only a flag whose kind argparse knows (an
integer, seconds, a choice) is refused by the parser itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from arbiterd.core.setting import TREE_KINDS, Setting

_TYPES: dict[str, type] = {"integer": int, "seconds": float}
Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def flag_help(s: Setting[Any], detailed: bool = False) -> str:
    """The help of a setting's flag: its help and default, or (``detailed``) also what a valid value is."""
    if detailed:
        return f"{s.help} ({s.expected}; default {s.shown(s.default)})"
    return s.help + (f" (default {s.shown(s.default)})" if s.default is not None else "")


def add_config_flags(p: argparse.ArgumentParser) -> None:
    """``--config`` and ``--check-config``, which every program with a config file takes."""
    p.add_argument("--config", metavar="FILE", help="TOML config file; flags given here override it")
    p.add_argument("--check-config", metavar="FILE",
                   help="validate FILE and exit 0, or exit 1 printing each error on one line")


def add_setting_flags(p: Parser, settings: Iterable[Setting[Any]], detailed: bool = False) -> None:
    """A flag for each setting that is one (``flag``), in the order given; none has a default of its own, so
    the flags that were given can be told from the rest (:func:`overrides`)."""
    for s in settings:
        if not s.flag:
            continue
        helptext = _escape(flag_help(s, detailed))
        if s.kind == "bool":
            p.add_argument(flag_name(s.name), dest=s.name, action=argparse.BooleanOptionalAction, default=None,
                           help=helptext)
            continue
        metavar = s.metavar
        if metavar is None and s.kind in TREE_KINDS and not s.choices:
            metavar = "N|auto" if s.kind == "auto" else "N"
        p.add_argument(flag_name(s.name), dest=s.name, default=None, type=_TYPES.get(s.kind, str), metavar=metavar,
                       choices=s.choices or None, help=helptext)


def overrides(args: argparse.Namespace, settings: Iterable[Setting[Any]]) -> dict[str, Any]:
    """The settings the command line gave, by name (the keys of the config file they override)."""
    return {s.name: getattr(args, s.name) for s in settings if s.flag and getattr(args, s.name, None) is not None}
