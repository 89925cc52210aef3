"""Man pages generated from the tools' own argument parsers, the settings' declarations and the env table.

    python -m docgen.manpages man/

writes ``arbiterd.8``, ``cgpuctl.8``, ``cgpu-smi.1``, ``cgpu-run.1``, ``cgpu-device-plugin.8``,
``cgpu-dra-plugin.8`` and ``kubectl-inspect-cgpu.1``. The
pages are committed under ``man/`` and installed with the package; a test
regenerates them and compares, so they cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from arbiterd import __version__
from docgen.reference import Entry, tree_files

SEE_ALSO = (("arbiterd", 8), ("cgpuctl", 8), ("cgpu-smi", 1), ("cgpu-run", 1), ("cgpu-device-plugin", 8),
            ("cgpu-dra-plugin", 8), ("kubectl-inspect-cgpu", 1))
DATE = "2026-11"  # changes with the version, not with every build, so the pages are reproducible


def _esc(text: str) -> str:
    """Text safe for roff: backslashes, and lines starting with . or '."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln[:1] in (".", "'") else ln for ln in text.splitlines())


def _para(text: str) -> str:
    return ".PP\n" + _esc(text) + "\n"


def _item(head: str, body: str) -> str:
    return f".TP\n.B {_esc(head)}\n{_esc(body)}\n"


def _options(parser: argparse.ArgumentParser) -> str:
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            out.append(f".SS {_esc(group.title or '')}\n")
            if group.description:
                out.append(_para(group.description))
        for a in actions:
            if isinstance(a, argparse._SubParsersAction):
                continue  # listed under COMMANDS
            if a.option_strings:
                metavar = a.metavar or (("{" + ",".join(map(str, a.choices)) + "}") if a.choices else None)
                takes = a.nargs != 0 and not isinstance(a, argparse.BooleanOptionalAction)
                head = ", ".join(f"{o} {metavar or a.dest.upper()}" if takes else o for o in a.option_strings)
            else:
                head = str(a.metavar or a.dest)
            out.append(_item(head, (a.help or "").replace("%%", "%")))
    return "".join(out)


def _subcommands(parser: argparse.ArgumentParser) -> str:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                usage = sub.format_usage().replace("usage: ", "").strip()
                help_ = next((c.help for c in a._choices_actions if c.dest == name), "") or ""
                out.append(_item(usage, help_))
    return "".join(out)


def _table(rows: Iterable[tuple[str, str]]) -> str:
    return "".join(_item(k, v) for k, v in rows)


def _tree_item(e: Entry) -> tuple[str, str]:
    if e.setting is None:
        return e.name, f"{e.help} ({'read-write' if e.writable else 'read-only'})"
    return e.name, f"{e.help}; {e.expected}, default {e.default} (read-write)"


def _settings() -> str:
    files = tree_files()
    part = {prefix: [_tree_item(e) for e in files if e.name.startswith(prefix) and "/" not in e.name[len(prefix):]]
            for prefix in ("", "N/", "N/ID/")}
    return (".SS Node\n" + _table(part[""]) + ".SS Per GPU\n" + _table(part["N/"])
            + ".SS Per instance\n" + _table(part["N/ID/"]))


@dataclass(frozen=True)
class Page:
    name: str
    section: int
    summary: str
    parser: Callable[[], argparse.ArgumentParser]
    extra: Callable[[], str] = lambda: ""

    def render(self) -> str:
        p = self.parser()
        usage = p.format_usage().replace("usage: ", "").strip()
        head = [
            f'.TH {self.name.upper()} {self.section} "{DATE}" "cgpu {__version__}" "cgpu"\n',
            f".SH NAME\n{_esc(self.name)} \\- {_esc(self.summary)}\n",
            f".SH SYNOPSIS\n.nf\n{_esc(usage)}\n.fi\n",
            ".SH DESCRIPTION\n" + _para((p.description or "").split("\n\n")[0]),
            ".SH OPTIONS\n" + _options(p),
        ]
        if (subs := _subcommands(p)):
            head.append(".SH COMMANDS\n" + subs)
        if p.epilog:
            head.append(".SH NOTES\n" + _para(p.epilog))
        head.append(self.extra())
        others = [f"{n}({s})" for n, s in SEE_ALSO if n != self.name]
        head.append(".SH SEE ALSO\n" + ", ".join(others) + "\n")
        return "".join(head)


def _arbiterd_extra() -> str:
    return (".SH SETTINGS\n" + _para("The settings tree that cgpuctl(8) reads and writes, as /proc/cgpu_km "
                                     "does on cGPU hosts (see docs/behaviour.md):") + _settings()
            + ".SH SIGNALS\n" + _table([("SIGTERM, SIGINT", "shut down cleanly; a second signal exits at once"),
                                        ("SIGHUP", "re-read the config file; flags given at start still win")])
            + ".SH CLIENTS\n" + _para(
                "Who a client is is fixed when it connects, from the kernel: its PID and uid (SO_PEERCRED) and that "
                "PID's cgroup, read while the kernel's pidfd pins the process. A process in a container is its "
                "container (if root made its cgroup); a process outside every container is uid-<uid> or an instance "
                "provisioned for its uid (inst_ctl create NAME uid=N). A peer whose cgroup cannot be read is "
                "refused. Connections are capped per uid (--max-clients-per-uid) and per instance "
                "(--max-clients-per-instance); each tenant's requests are served in turns; a connection that leaves "
                "more than --max-unread-bytes of replies unread, or says hello and does not register within "
                "idle_timeout_s, is closed. SECURITY.md has the threat model.")
            + ".SH FILES\n" + _table([("/etc/cgpu/arbiterd.toml", "the config file (--config)"),
                                      ("/run/cgpu", "the run dir: refused if another non-root user owns it or "
                                                    "everyone may write it without the sticky bit"),
                                      ("/run/cgpu/arbiter.sock", "the client socket, 0660, group socket_group"),
                                      ("/run/cgpu/admin.sock", "the admin API (cgpuctl, cgpu-smi, /metrics)"),
                                      ("/var/lib/cgpu/state.json", "every setting, saved before it takes effect; "
                                                                   "an item that fails its checks at start is "
                                                                   "skipped and the file kept as "
                                                                   "state.json.bad-<time>")]))


def _cgpuctl_extra() -> str:
    return (".SH SETTINGS\n" + _settings()
            + ".SH EXIT STATUS\n" + _table([("0", "success"), ("1", "the daemon refused (its reason is printed)"),
                                            ("2", "usage error"), ("3", "the daemon is unreachable")]))


def _smi_extra() -> str:
    return ".SH EXIT STATUS\n" + _table([("0", "success"), ("1", "the daemon refused"),
                                         ("3", "the daemon is unreachable")])


def _run_extra() -> str:
    from libcgpu_client.env import VARIABLES

    return (".SH ENVIRONMENT\n" + _para("cgpu-run sets these for CMD; a program started otherwise may set them "
                                        "itself. A malformed value stops it at start with one line.")
            + _table(VARIABLES.items())
            + ".SH EXIT STATUS\n" + _table([("2", "a malformed flag or variable (before CMD starts)"),
                                            ("127", "CMD cannot be run"), ("other", "CMD's own status")]))


def _plugin_extra() -> str:
    return (".SH RESOURCES\n" + _table([("aliyun.com/gpu-mem", "one device per GiB of each card"),
                                        ("aliyun.com/gpu-core.percentage", "one device per percent of each card "
                                         "(requests in multiples of 5)")])
            + ".SH FILES\n" + _table([("/etc/cgpu/cgpu-device-plugin.toml", "the config file (--config)"),
                                      ("/var/lib/kubelet/device-plugins/kubelet.sock", "the kubelet it registers "
                                       "with; it serves cgpu-mem.sock and cgpu-core.sock beside it"),
                                      ("/var/lib/cgpu/alloc", "allocation tokens (root only) and state.json")])
            + _para("See docs/kubernetes.md for what a pod gets, and SECURITY.md for how an allocation is bound "
                    "to its container."))


def _dra_extra() -> str:
    return (".SH CAPACITY\n" + _table([("memory", "bytes of the card, requested in whole GiB (default 1Gi)"),
                                       ("cores", "percent of the card's time, 0..100 in steps of 5 (default 0)")])
            + ".SH FILES\n" + _table([("/var/lib/kubelet/plugins_registry/gpu.cgpu.io-reg.sock",
                                       "the registration socket the kubelet's plugin watcher finds"),
                                      ("/var/lib/kubelet/plugins/gpu.cgpu.io/dra.sock",
                                       "the DRAPlugin service (v1 and v1beta1)"),
                                      ("/var/lib/cgpu/dra", "checkpoint.json and allocation tokens (root only)"),
                                      ("/var/run/cdi", "one CDI spec per prepared claim")])
            + _para("See docs/kubernetes.md for the claims, the ShareConfig and when to use DRA or the device "
                    "plugin."))


def _inspect_extra() -> str:
    return ".SH EXIT STATUS\n" + _table([("0", "success"), ("1", "the API server refused"),
                                         ("3", "the API server is unreachable, or no kubeconfig")])


def _dra_parser() -> argparse.ArgumentParser:
    from cgpu_dra_plugin.main import build_parser

    return build_parser()


def _inspect_parser() -> argparse.ArgumentParser:
    from cgpu_dra_plugin.kubectl import build_parser

    return build_parser()


def _plugin_parser() -> argparse.ArgumentParser:
    from cgpu_device_plugin.main import build_parser

    return build_parser()


def _arbiterd_parser() -> argparse.ArgumentParser:
    from arbiterd.main import build_parser

    return build_parser()


def _cgpuctl_parser() -> argparse.ArgumentParser:
    from arbiterd.tools.cgpuctl import build_parser

    return build_parser()


def _smi_parser() -> argparse.ArgumentParser:
    from arbiterd.tools.smi import build_parser

    return build_parser()


def _run_parser() -> argparse.ArgumentParser:
    from libcgpu_client.run import build_parser

    return build_parser()


PAGES = (
    Page("arbiterd", 8, "the cgpu node daemon: GPU time slices and memory limits for containers",
         _arbiterd_parser, _arbiterd_extra),
    Page("cgpuctl", 8, "read and write arbiterd's settings tree", _cgpuctl_parser, _cgpuctl_extra),
    Page("cgpu-smi", 1, "show arbiterd's GPUs, instances and shares", _smi_parser, _smi_extra),
    Page("cgpu-run", 1, "run a program under the cgpu interposer", _run_parser, _run_extra),
    Page("cgpu-device-plugin", 8, "sell GPU memory and GPU-core percentages to Kubernetes pods",
         _plugin_parser, _plugin_extra),
    Page("cgpu-dra-plugin", 8, "place pods' GPU memory and cores on one card through Kubernetes DRA",
         _dra_parser, _dra_extra),
    Page("kubectl-inspect-cgpu", 1, "show cgpu's GPUs in a cluster: memory and cores allocated per card",
         _inspect_parser, _inspect_extra),
)


def write(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for page in PAGES:
        path = out_dir / f"{page.name}.{page.section}"
        path.write_text(page.render())
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write(Path(sys.argv[1] if len(sys.argv) > 1 else "man")):
        print(written)
