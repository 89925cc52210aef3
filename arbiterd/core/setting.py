"""One setting, declared once: its kind, default, range or choices, help, and where it appears.

Every setting of every cgpu program is a :class:`Setting`: the per-GPU,
per-instance and node-wide settings of the settings tree
(``arbiterd.core.settings``), the daemon's own options
(``arbiterd.server.config``) and the device plugin's
(``cgpu_device_plugin.config``). Where it appears is part of the declaration:
a command-line flag (``flag``), a key of the program's TOML file (``toml``), a
file of the settings tree (``tree``). The flags, the config files, the tree,
the man pages and the documents' tables are all derived from these
declarations.

A value is refused the same way everywhere: :meth:`Setting.parse` takes text
(a tree write, a flag) and :meth:`Setting.check` a value as given (TOML, the
wire, the state file); both raise a one-line :class:`SettingError` naming the
setting, what was expected and what was given.

Declare settings as fields of a dataclass with :func:`setting`, and make the
table of that class with :func:`table`, which fills in each setting's name,
scope and places.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, Literal, TypeVar, cast

from arbiterd.core.errors import SettingError

# Numbers of the settings tree, also written as text ("12", "auto", "4GiB"):
#   int, auto (an int or "auto"), size (bytes, or with a unit), flag (0 or 1), percent (5..100 in steps of 5),
#   enum (one of its choices by name; stored as the choice's index, so the tree's tables stay of ints).
# Program options, given typed by TOML or by the flag's parser:
#   integer, seconds (int or float), bool, choice, mode (a file mode; octal text from a flag), string, path.
Kind = Literal["int", "auto", "size", "flag", "percent", "enum",
               "integer", "seconds", "bool", "choice", "mode", "string", "path"]
Scope = Literal["global", "gpu", "instance", "daemon", "plugin"]
Rule = Callable[[Any], str | None]  # a further check: None, or what was expected instead
T = TypeVar("T")
AUTO = 0  # the stored value of a setting of kind "auto" that is set to auto
MAX = 2**63 - 1

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_OCTAL = set("01234567")
TREE_KINDS = ("int", "auto", "size", "flag", "percent", "enum")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """How one setting is declared, written, read and checked."""

    default: T
    help: str
    lo: float = 0
    hi: float = MAX
    kind: Kind = "int"
    name: str = ""
    scope: Scope = "gpu"
    tree: bool = True  # a file of the settings tree
    live: bool = True  # takes effect at once (else at the next grant)
    flag: bool = False  # a command-line flag, --<name with dashes>
    toml: bool = False  # a key of the program's TOML file
    restart: bool = False  # a reload cannot change it; it takes effect at the next start
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    expects: str = ""  # what a valid value looks like, where the kind alone does not say it
    rule: Rule | None = None
    lo_open: bool = False  # seconds: lo itself is refused

    @property
    def expected(self) -> str:
        """What a valid value looks like, for error messages, help and documents."""
        if self.expects:
            return self.expects
        if self.kind in ("int", "integer"):
            return f"an integer {self.lo}..{self.hi}"
        if self.kind == "seconds":
            return f"seconds in ({self.lo:g}, {self.hi:g}]" if self.lo_open else f"seconds {self.lo:g}..{self.hi:g}"
        if self.kind in ("choice", "enum"):
            return f"one of {', '.join(self.choices)}"
        return _EXPECTED[self.kind].format(s=self)

    def parse(self, text: str) -> T:
        """A value written as text (a tree write, a flag); raises SettingError naming the setting."""
        if self.kind not in TREE_KINDS:
            return self.check(text)
        t = text.strip()
        if self.kind == "auto" and t.lower() == "auto":
            return cast(T, AUTO)
        if self.kind == "enum":
            if t not in self.choices:
                raise self.bad(t)
            return cast(T, self.choices.index(t))
        if self.kind == "size":
            m = _SIZE.match(t)
            if not m or m.group(2).lower() not in _UNITS:
                raise self.bad(t)
            return self.check(int(m.group(1)) * _UNITS[m.group(2).lower()])
        if not _INT.match(t):
            raise self.bad(t)
        return self.check(int(t))

    def check(self, value: object, hi: int | None = None) -> T:
        """The stored form of ``value`` as given from outside (a number, or text such as ``auto``); ``hi``
        narrows the range (a weight to the GPU's max_inst)."""
        if value is None and self.default is None:
            return cast(T, None)
        out = _CHECKS[self.kind](self, value, hi)
        if self.rule is not None and (problem := self.rule(out)) is not None:
            raise SettingError(f"{self.name}: expected {problem}, got {value!r}")
        return cast(T, out)

    def valid(self, value: object, hi: int | None = None) -> T:
        """``value`` if it is a valid stored value (``AUTO`` included), for code that holds stored values."""
        if self.kind == "auto" and type(value) is int and value == AUTO:
            return cast(T, AUTO)
        if self.kind == "enum" and type(value) is int and 0 <= value < len(self.choices):
            return cast(T, value)
        return self.check(value, hi)

    def bad(self, value: object) -> SettingError:
        """The error for a value that is not of this setting's kind."""
        return SettingError(f"{self.name}: expected {self.expected}, got {value!r}")

    def format(self, value: Any) -> str:
        """The text a value reads back as."""
        if self.kind == "enum":
            return self.choices[cast(int, value)]
        return "auto" if self.kind == "auto" and value == AUTO else str(value)

    def external(self, value: Any) -> int | str:
        """The value as files and documents hold it: ``auto``, an enum's name, or the number."""
        if self.kind == "enum":
            return self.choices[cast(int, value)]
        return "auto" if self.kind == "auto" and value == AUTO else cast(int, value)

    def shown(self, value: Any) -> str:
        """A value as help and documents show it (``auto``, ``on``, ``0o600``, ``2``)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, float):
            return f"{value:g}"
        if self.kind == "mode":
            return f"0o{value:o}"
        return self.format(value)

    def as_field(self) -> Any:
        """A dataclass field holding this (already declared) setting in another class."""
        return field(default=self.default, metadata={"setting": self, "places": {}})


_EXPECTED = {
    "auto": "auto or an integer {s.lo}..{s.hi}",
    "size": "a size in bytes (or with KiB/MiB/GiB)",
    "flag": "0 or 1",
    "percent": "a multiple of 5 from 5 to 100",
    "bool": "true or false",
    "mode": "a file mode 0..0o777 (in TOML 0o660, on the command line 0660)",
    "string": "a string",
    "path": "a path",
}


def _number(s: Setting[Any], value: object, hi: int | None) -> int:
    if isinstance(value, str):
        return cast(int, s.parse(value))
    if s.kind == "enum":  # given from outside by its name only
        raise s.bad(value)
    if s.kind == "flag" and isinstance(value, bool):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (s.kind == "size" and value < 0):
        raise s.bad(value)
    top = s.hi if hi is None else hi
    if s.kind == "percent" and (value % 5 or not s.lo <= value <= s.hi):
        raise SettingError(f"{s.name}: expected {s.expected}, got {value}")
    if not s.lo <= value <= top:
        raise SettingError(f"{s.name}: {value} is out of range {s.lo}..{top}")
    return value


def _integer(s: Setting[Any], value: object, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not s.lo <= value <= s.hi:
        raise s.bad(value)
    return value


def _seconds(s: Setting[Any], value: object, hi: int | None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise s.bad(value)
    if not (s.lo < value if s.lo_open else s.lo <= value) or value > s.hi:
        raise s.bad(value)
    return value


def _bool(s: Setting[Any], value: object, hi: int | None) -> bool:
    if not isinstance(value, bool):
        raise s.bad(value)
    return value


def _choice(s: Setting[Any], value: object, hi: int | None) -> str:
    if not isinstance(value, str) or value not in s.choices:
        raise s.bad(value)
    return value


def _mode(s: Setting[Any], value: object, hi: int | None) -> int:
    mode = value
    if isinstance(mode, str) and mode.isascii() and mode.isdigit() and set(mode) <= _OCTAL:
        mode = int(mode, 8)  # a flag: octal text
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
        raise s.bad(value)
    return mode


def _string(s: Setting[Any], value: object, hi: int | None) -> str:
    if not isinstance(value, str) or (s.kind == "path" and not value):
        raise s.bad(value)
    return value


_CHECKS: dict[str, Callable[[Setting[Any], object, int | None], object]] = {
    **dict.fromkeys(TREE_KINDS, _number), "integer": _integer, "seconds": _seconds, "bool": _bool,
    "choice": _choice, "mode": _mode, "string": _string, "path": _string,
}


def setting(default: Any, help: str, lo: float = 0, hi: float = MAX, kind: Kind = "int", *,
            tree: bool | None = None, flag: bool | None = None, toml: bool | None = None, live: bool = True,
            restart: bool = False, choices: tuple[str, ...] = (), metavar: str | None = None, expects: str = "",
            rule: Rule | None = None, lo_open: bool = False) -> Any:
    """A dataclass field that is a setting. The name and scope come from the class (:func:`table`), and so do
    the places (``tree``, ``flag``, ``toml``) not given here."""
    places = {k: v for k, v in (("tree", tree), ("flag", flag), ("toml", toml)) if v is not None}
    spec = Setting(default, help, lo, hi, kind, live=live, restart=restart, choices=choices, metavar=metavar,
                   expects=expects, rule=rule, lo_open=lo_open)
    return field(default=default, metadata={"setting": spec, "places": places})


def table(cls: type, scope: Scope, *, tree: bool = False, flag: bool = False,
          toml: bool = False) -> dict[str, Setting[Any]]:
    """The settings of ``cls``, each named after its field; ``tree``, ``flag``, ``toml``: where the settings of
    this class appear unless one says otherwise. A field holding a setting declared in another class
    (:meth:`Setting.as_field`) keeps that declaration."""
    out: dict[str, Setting[Any]] = {}
    for f in fields(cls):
        spec: Setting[Any] | None = f.metadata.get("setting")
        if spec is None:
            continue
        if spec.name:
            out[f.name] = spec
            continue
        places = {"tree": tree, "flag": flag, "toml": toml, **f.metadata["places"]}
        out[f.name] = replace(spec, name=f.name, scope=scope, **places)
    return out


def parse_size(name: str, text: str) -> int:
    """Bytes from ``4294967296``, ``4GiB`` or ``512MiB`` (for values that are not settings)."""
    return Setting(0, "", kind="size", name=name).parse(text)
