"""Who an allocation's container is to Kubernetes: its namespace, pod and container names.

A plugin tells arbiterd through ``alloc_ctl`` (admin.sock, an operator's surface), from
the kubelet's PodResources API or a claim's ``status.reservedFor`` and its pod's spec; a
container never does. The names are checked by the rules the API server applies to them
(k8s.io/apimachinery ``validation.IsDNS1123Label`` for namespaces and container names,
``IsDNS1123Subdomain`` for pod names), so a value that reaches a metric label, ``status``
or ``cgpu-smi`` holds only lowercase letters, digits, ``-`` and ``.``, within their
lengths: nothing a label parser, a terminal or a log line could take for something else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arbiterd.core.errors import SettingError

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_MAX = 63  # IsDNS1123Label
SUBDOMAIN_MAX = 253  # IsDNS1123Subdomain
KEYS = ("namespace", "pod", "container")


def _label(what: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > LABEL_MAX or not DNS1123_LABEL.fullmatch(value):
        raise SettingError(f"{what}={_shown(value)} is not a Kubernetes name: at most {LABEL_MAX} lowercase letters, "
                           "digits and '-', starting and ending with a letter or digit")
    return value


def _subdomain(what: str, value: object) -> str:
    if (not isinstance(value, str) or len(value) > SUBDOMAIN_MAX
            or not all(DNS1123_LABEL.fullmatch(part) for part in value.split("."))):
        raise SettingError(f"{what}={_shown(value)} is not a Kubernetes name: at most {SUBDOMAIN_MAX} lowercase "
                           "letters, digits, '-' and '.', each part starting and ending with a letter or digit")
    return value


def _shown(value: object) -> str:
    """``value`` for a one-line message: quoted and escaped (a control character shows as its escape), cut short."""
    text = ascii(value)
    return text if len(text) <= 72 else text[:69] + "..."


@dataclass(frozen=True, slots=True)
class PodLabels:
    """A container's namespace, pod and container names; ``container`` is empty where it is not known (a DRA claim
    that several containers of its pod name). Built only through :func:`check`."""

    namespace: str
    pod: str
    container: str = ""

    def text(self) -> str:
        """``namespace/pod`` with ``/container`` where known: how ``status`` and ``cgpu-smi`` show it."""
        return f"{self.namespace}/{self.pod}" + (f"/{self.container}" if self.container else "")

    def words(self) -> str:
        """The ``alloc_ctl`` words that give these labels."""
        return f"namespace={self.namespace} pod={self.pod}" + (f" container={self.container}" if self.container
                                                                 else "")

    def to_json(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


def check(namespace: object, pod: object, container: object = "") -> PodLabels:
    """The labels, each checked by the Kubernetes rule for its kind of name; a SettingError (one line) naming the
    first bad one."""
    return PodLabels(_label("namespace", namespace), _subdomain("pod", pod),
                     _label("container", container) if container != "" else "")


def from_words(opts: Mapping[str, str]) -> PodLabels | None:
    """The labels that ``namespace=``, ``pod=`` and ``container=`` of an ``alloc_ctl`` line give; None when it names
    none of them. ``namespace`` and ``pod`` go together."""
    given = {k: opts[k] for k in KEYS if k in opts}
    if not given:
        return None
    if "namespace" not in given or "pod" not in given:
        raise SettingError("alloc_ctl: namespace= and pod= go together (container= is optional)")
    return check(given["namespace"], given["pod"], given.get("container", ""))


def from_json(item: Any) -> PodLabels | None:
    """The labels a state file or a status document holds (None: none); raise SettingError when they are bad."""
    if item is None:
        return None
    if not isinstance(item, dict) or set(item) - set(KEYS):
        raise SettingError(f"labels: expected a map of {', '.join(KEYS)}, got {_shown(item)}")
    return check(item.get("namespace"), item.get("pod"), item.get("container", ""))
