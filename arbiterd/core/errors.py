"""Typed errors raised by the core. Each carries a one-line, user-facing reason.

The type says how a refusal is answered, in one place per surface: a client
gets an ``error`` with :attr:`CoreError.code`, the admin API an HTTP status
(:attr:`CoreError.http_status`).
"""

from __future__ import annotations


class CoreError(Exception):
    """Base class: the request was refused and nothing changed."""

    code = "refused"
    http_status = 400


class SettingError(CoreError):
    """A value that is malformed or out of range."""

    code = "bad_request"


class ConflictError(SettingError):
    """A valid value that the current state does not allow (a weight sum, connected clients)."""

    code = "refused"
    http_status = 409


class ReadOnlyError(CoreError):
    """A write to a read-only node of the settings tree."""

    http_status = 403


class NotFoundError(CoreError):
    """An unknown GPU, instance, path or lease."""

    code = "not_found"
    http_status = 404


class BusyError(CoreError):
    """A tenant already holds as much of a bounded resource as it may (connections, records)."""

    code = "busy"
    http_status = 429


class IdentityError(CoreError):
    """A client tried to act as an instance it does not belong to."""

    code = "identity"
    http_status = 403
