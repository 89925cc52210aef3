"""A program's configuration: a TOML file, overridden by the flags that were given; every error at once.

Each key is a setting declared with :func:`arbiterd.core.setting.setting` (``toml``); a value is checked by
its declaration and refused with the same one-line message as on a flag or in the tree. A refused value
changes nothing: the setting keeps its default.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from arbiterd.core.errors import SettingError
from arbiterd.core.setting import Setting

Target = tuple[object, Mapping[str, Setting[Any]]]  # an object, and the settings that are its attributes


class Sourced(Protocol):
    source: str | None


C = TypeVar("C", bound=Sourced)
FromMapping = Callable[[dict[str, Any]], tuple[C, list[str]]]


def read_file(path: str) -> tuple[dict[str, Any], list[str]]:
    """The keys of the TOML file at ``path``, or one line saying why it cannot be read."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return {}, [f"{path}: cannot read ({exc.strerror})"]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"{path}: not valid TOML ({exc})"]


def apply(data: Mapping[str, Any], targets: Sequence[Target]) -> list[str]:
    """Set each key of ``data`` on the object whose settings declare it as a TOML key, checked; every error:
    unknown keys first, then bad values in the order the settings are declared."""
    known = {name for _, settings in targets for name, s in settings.items() if s.toml}
    errs = [f"{key}: unknown setting" for key in data if key not in known]
    for obj, settings in targets:
        for name, s in settings.items():
            if s.toml and name in data:
                try:
                    setattr(obj, name, s.check(data[name]))
                except SettingError as exc:
                    errs.append(str(exc))
    return errs


def load(path: str | None, overrides: Mapping[str, Any], from_mapping: FromMapping[C]) -> tuple[C, list[str]]:
    """The file at ``path`` (if any) with ``overrides`` over it, and every error found."""
    data: dict[str, Any] = {}
    errs: list[str] = []
    if path is not None:
        data, errs = read_file(path)
    cfg, more = from_mapping({**data, **overrides})
    cfg.source = path
    return cfg, errs + more


@dataclass(frozen=True)
class Loader(Generic[C]):
    """How one program reads its config: ``from_mapping`` makes it from the keys and lists every error;
    ``load`` raises ``error`` with the errors joined by ``sep`` (one line each, or one line for all)."""

    from_mapping: FromMapping[C]
    sep: str = "; "
    error: type[SettingError] = SettingError

    def load(self, path: str | None, overrides: Mapping[str, Any]) -> C:
        """Read ``path`` (if any) and apply ``overrides``; raise ``error`` listing every error."""
        cfg, errs = load(path, overrides, self.from_mapping)
        if errs:
            raise self.error(self.sep.join(errs))
        return cfg

    def check_file(self, path: str) -> list[str]:
        """Every error in the config file at ``path``, one per line (empty when valid)."""
        data, errs = read_file(path)
        return errs or self.from_mapping(data)[1]
