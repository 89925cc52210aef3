"""Memory ledger: one per (instance, GPU), shared by all of the instance's processes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class MemDecision:
    ok: bool
    used: int
    limit: int
    reason: str = ""


@dataclass(slots=True)
class MemoryLedger:
    """Bytes reserved by each client of one instance on one GPU, against one limit."""

    limit: int
    by_client: dict[int, int] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)  # client -> pid

    @property
    def used(self) -> int:
        return sum(self.by_client.values())

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    def reserve(self, client: int, pid: int, nbytes: int) -> MemDecision:
        if nbytes < 0:
            return MemDecision(False, self.used, self.limit, "negative size")
        used = self.used
        if used + nbytes > self.limit:
            return MemDecision(
                False, used, self.limit,
                f"out of memory: {nbytes} bytes requested, {self.limit - used} of {self.limit} free",
            )
        self.by_client[client] = self.by_client.get(client, 0) + nbytes
        self.pids[client] = pid
        return MemDecision(True, used + nbytes, self.limit)

    def free_bytes(self, client: int, nbytes: int) -> MemDecision:
        have = self.by_client.get(client, 0)
        left = max(0, have - max(0, nbytes))
        if left:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)
        return MemDecision(True, self.used, self.limit)

    def drop_client(self, client: int) -> int:
        """Return everything ``client`` held; give back how many bytes that was."""
        self.pids.pop(client, None)
        return self.by_client.pop(client, 0)

    def by_pid(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for client, nbytes in self.by_client.items():
            pid = self.pids.get(client, 0)
            out[pid] = out.get(pid, 0) + nbytes
        return out

    def meminfo(self) -> str:
        lines = [f"Free: {self.free}"]
        lines += [f"PID: {pid} Mem: {n}" for pid, n in sorted(self.by_pid().items())]
        return "\n".join(lines) + "\n"
