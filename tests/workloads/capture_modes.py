"""Stream capture's rules on the fake driver: for each (capture mode, other thread's mode), a capture is begun on the
main thread, another thread calls cuCtxSynchronize in its mode, on the capture's own context ("own") or on a second
context ("other"), and the capture is ended. Prints {"CAPTURE/OTHER": {"own": [the sync's rc, the end's rc],
"other": [...]}} as JSON."""

from __future__ import annotations

import ctypes
import json
import threading

cuda = ctypes.CDLL("libcuda.so.1")
MODES = {"global": 0, "thread_local": 1, "relaxed": 2}


def check(rc: int) -> None:
    if rc != 0:
        raise SystemExit(f"driver call failed: {rc}")


check(cuda.cuInit(0))
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0))
check(cuda.cuCtxSetCurrent(ctx))
stream = ctypes.c_void_p()
check(cuda.cuStreamCreate(ctypes.byref(stream), 0))
second = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(second), 0, 0))
check(cuda.cuCtxSetCurrent(ctx))
out: dict[str, dict[str, list[int]]] = {}
for capture, other in (("global", "global"), ("global", "relaxed"), ("global", "thread_local"),
                       ("thread_local", "global"), ("relaxed", "global")):
    for where, target in (("own", ctx), ("other", second)):
        check(cuda.cuStreamBeginCapture_v2(stream, MODES[capture]))
        rc: list[int] = []

        def sync(mode: str = other, rc: list[int] = rc, target: ctypes.c_void_p = target) -> None:
            cuda.cuCtxSetCurrent(target)
            m = ctypes.c_int(MODES[mode])
            cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))
            rc.append(cuda.cuCtxSynchronize())

        t = threading.Thread(target=sync)
        t.start()
        t.join()
        graph = ctypes.c_void_p()
        end = cuda.cuStreamEndCapture(stream, ctypes.byref(graph))
        if end == 0:
            check(cuda.cuGraphDestroy(graph))
        out.setdefault(f"{capture}/{other}", {})[where] = [rc[0], end]
print(json.dumps(out))
