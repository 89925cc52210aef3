"""Typed errors raised by the core. Each carries a one-line, user-facing reason."""


class CoreError(Exception):
    """Base class: the request was refused and nothing changed."""


class SettingError(CoreError):
    """A setting value is out of range or would break an invariant."""


class ReadOnlyError(CoreError):
    """A write to a read-only node of the settings tree."""


class NotFoundError(CoreError):
    """An unknown GPU, instance, path or lease."""


class IdentityError(CoreError):
    """A client tried to act as an instance it does not belong to."""
