"""``inst_ctl``: provisioning instance records through the settings tree.

    create ID [gpu=0,1] [weight=N | core=P] [limit=P] [highprio=0|1] [memsize=SIZE] [uid=N]
    remove ID [gpu=N]

``limit=P``: the most GPU time (%) the instance may use (behaviour §3, requests and limits); beside
``core=P`` a limit above the core percentage puts an unused GPU on policy 4 with 20 slots, not 3.

``uid=N`` makes ID an instance for host processes of uid N (they declare it
with ``CGPU_INSTANCE``); no container, and no other uid, may use it. Reading the
file lists the provisioned records, one a line, in the form a ``create`` takes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from arbiterd.core.arbiter import Arbiter
from arbiterd.core.effects import Effect
from arbiterd.core.errors import SettingError
from arbiterd.core.names import valid_instance_id
from arbiterd.core.settings import INSTANCE, NO_LIMIT, UNCAPPED, InstanceSettings

USAGE = ("inst_ctl: expected 'create ID [gpu=0,1] [weight=N | core=P] [limit=P] [highprio=0|1] [memsize=SIZE] "
         "[uid=N]' "
         "or 'remove ID [gpu=N]'")
_OPTION = {"weight": "weight", "core": "core_percent", "highprio": "highprio", "memsize": "memsize", "limit": "limit"}
_CONTAINER_LIKE = re.compile(r"[0-9a-f]{12}|[0-9a-f]{64}")  # what a container's instance id looks like
UID_MAX = 2**32 - 2  # (uid_t)-1 means "no uid"


def listing(arb: Arbiter) -> str:
    lines = []
    for (gpu, name), rec in sorted(arb.records.items()):
        if rec.provisioned:
            st = arb.scheds[gpu].instances[name]
            uid = f" uid={rec.host_uid}" if rec.host_uid is not None else ""
            limit = f" limit={st.limit}" if st.limit < NO_LIMIT else ""
            lines.append(f"{name} gpu={gpu} weight={st.weight}{limit} highprio={int(st.highprio)} "
                         f"memsize={rec.memsize}{uid}")
    return "".join(line + "\n" for line in lines)


def parse_gpus(arb: Arbiter, text: str) -> list[int]:
    """``0,1`` -> GPU indices of this host; refuses anything else with one line."""
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise SettingError(f"gpu: expected indices like 0,1, got {text!r}") from None
    for gpu in gpus:
        arb.sched(gpu)
    return gpus


def run(arb: Arbiter, command: str, now: int) -> list[Effect]:
    """Carry out one ``inst_ctl`` command."""
    return plan(arb, command)(now)


def plan(arb: Arbiter, command: str) -> Callable[[int], list[Effect]]:
    """Check one ``inst_ctl`` command, changing nothing (a CoreError with a one-line reason if it may not be
    carried out), and return what carries it out."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise SettingError(f"inst_ctl: {exc}") from None
    if len(words) < 2 or words[0] not in ("create", "remove"):
        raise SettingError(USAGE)
    verb, name, rest = words[0], valid_instance_id(words[1]), words[2:]
    opts: dict[str, str] = {}
    allowed = {"gpu", "uid", *_OPTION} if verb == "create" else {"gpu"}
    for word in rest:
        key, sep, val = word.partition("=")
        if not sep or key not in allowed or key in opts:
            raise SettingError(f"inst_ctl {verb}: unexpected {word!r}")
        opts[key] = val
    gpus = parse_gpus(arb, opts.pop("gpu")) if "gpu" in opts else None
    if verb == "remove":
        arb.check_unprovision(name, gpus)
        return lambda now: arb.unprovision(name, gpus, now)
    if "core" in opts and "weight" in opts:
        raise SettingError("inst_ctl create: give weight=N or core=P (a GPU-core percentage), not both")
    uid = _uid(name, opts.pop("uid")) if "uid" in opts else None
    values = {_OPTION[k]: INSTANCE[_OPTION[k]].parse(v) for k, v in opts.items()}
    if values.get("core_percent") and values.get("limit") == NO_LIMIT:
        values["limit"] = UNCAPPED  # given, beside a core percentage: no ceiling (policy 4), not its own cap
    settings = dict.fromkeys(gpus if gpus is not None else sorted(arb.scheds), InstanceSettings(**values))
    arb.check_provision(name, settings)
    return lambda now: arb.provision_each(name, settings, now, uid)


def _uid(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) > UID_MAX:
        raise SettingError(f"uid: expected a number 0..{UID_MAX}, got {text!r}")
    if _CONTAINER_LIKE.fullmatch(name):
        raise SettingError(f"inst_ctl create: {name} looks like a container id; a host instance needs another name")
    return int(text)


__all__ = ["listing", "plan", "run"]
