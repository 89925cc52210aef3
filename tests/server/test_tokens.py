"""Allocation tokens are read inside the client's root, never through a symlink it planted."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from arbiterd.server import config, tokens
from arbiterd.server.identity import IdentityResolver, pod_uid_from_cgroup
from cgpu_testing.containers import fake_cgroup

CID = "0123456789abcdef" * 4
POD = "0a1b2c3d-1111-2222-3333-444455556666"


def container(tmp_path: Path, pid: int = 42) -> Path:
    """A fake /proc/<pid>/root pointing at a rootfs, as the kernel's magic link does."""
    rootfs = tmp_path / "rootfs"
    (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    rootfs.mkdir()
    (tmp_path / "proc" / str(pid) / "root").symlink_to(rootfs)
    return rootfs


def put(rootfs: Path, alloc: str, token: bytes) -> None:
    d = rootfs / "run" / "cgpu-alloc" / alloc
    d.mkdir(parents=True)
    (d / "token").write_bytes(token)


def test_tokens_are_hashed_as_the_plugin_hashes_them(tmp_path: Path) -> None:
    rootfs = container(tmp_path)
    put(rootfs, "mem-1", b"ab" * 32 + b"\n")
    put(rootfs, "core-1", b"cd" * 32)
    scan = tokens.scan(tmp_path / "proc", 42, "/run/cgpu-alloc")
    assert scan.digests == {hashlib.sha256(b"ab" * 32).hexdigest(), hashlib.sha256(b"cd" * 32).hexdigest()}
    assert scan.skipped == []


def test_no_allocation_dir_is_no_token_and_no_complaint(tmp_path: Path) -> None:
    container(tmp_path)
    scan = tokens.scan(tmp_path / "proc", 42, "/run/cgpu-alloc")
    assert scan.digests == set() and scan.skipped == []
    assert tokens.scan(tmp_path / "proc", 43, "/run/cgpu-alloc").digests == set()  # no such process


@pytest.mark.parametrize("where", ["entry", "token", "mount"])
def test_symlinks_planted_by_the_container_are_not_followed(tmp_path: Path, where: str) -> None:
    rootfs = container(tmp_path)
    host = tmp_path / "host-alloc" / "victim"
    host.mkdir(parents=True)
    (host / "token").write_text("ef" * 32)
    alloc = rootfs / "run" / "cgpu-alloc"
    if where == "mount":
        (rootfs / "run").mkdir()
        alloc.symlink_to(host.parent)
    else:
        alloc.mkdir(parents=True)
        if where == "entry":
            (alloc / "stolen").symlink_to(host)
        else:
            (alloc / "stolen").mkdir()
            (alloc / "stolen" / "token").symlink_to(host / "token")
    scan = tokens.scan(tmp_path / "proc", 42, "/run/cgpu-alloc")
    assert scan.digests == set()
    assert len(scan.skipped) == 1


def test_only_small_regular_files_are_read(tmp_path: Path) -> None:
    rootfs = container(tmp_path)
    put(rootfs, "big", b"x" * (tokens.MAX_TOKEN + 1))
    (rootfs / "run" / "cgpu-alloc" / "fifo").mkdir()
    os.mkfifo(rootfs / "run" / "cgpu-alloc" / "fifo" / "token")
    scan = tokens.scan(tmp_path / "proc", 42, "/run/cgpu-alloc")
    assert scan.digests == set() and len(scan.skipped) == 2


@pytest.mark.parametrize(("text", "pod"), [
    (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope", POD),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
     f"cri-containerd-{CID}.scope", POD),
    (f"12:memory:/kubepods/besteffort/pod{POD}/{CID}", POD),
    (f"0::/system.slice/docker-{CID}.scope", None),
])
def test_the_pod_uid_comes_from_the_cgroup(tmp_path: Path, text: str, pod: str | None) -> None:
    assert pod_uid_from_cgroup(text) == pod
    fake_cgroup(tmp_path, os.getpid(), text)
    resolver = IdentityResolver("cgroup", str(tmp_path))
    ident = resolver.identify(resolver.peer(os.getpid(), 0), None)
    assert (ident.instance, ident.container, ident.pod) == (CID[:12], CID, pod)


def test_allocations_need_cgroup_identity() -> None:
    _, errors = config.from_mapping({"allocations": "required", "identity": "declared"})
    assert errors == ['allocations: binding an allocation to its container needs identity = "cgroup"']
    _, errors = config.from_mapping({"allocations": "sometimes"})
    assert errors == ["allocations: expected one of off, optional, required, got 'sometimes'"]
    _, errors = config.from_mapping({"alloc_mount": "run/../x"})
    assert len(errors) == 1 and errors[0].startswith("alloc_mount: expected an absolute path")
