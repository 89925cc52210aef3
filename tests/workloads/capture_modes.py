"""Stream capture's interaction modes on the fake driver: for each (capture mode, other thread's mode), a capture
is begun on the main thread, another thread calls cuCtxSynchronize in its mode, and the capture is ended.
Prints {"CAPTURE/OTHER": [the sync's rc, the end's rc]} as JSON."""

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
out = {}
for capture, other in (("global", "global"), ("global", "relaxed"), ("global", "thread_local"),
                       ("thread_local", "global"), ("relaxed", "global")):
    check(cuda.cuStreamBeginCapture_v2(stream, MODES[capture]))
    rc: list[int] = []

    def sync(mode: str = other, rc: list[int] = rc) -> None:
        cuda.cuCtxSetCurrent(ctx)
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
    out[f"{capture}/{other}"] = [rc[0], end]
print(json.dumps(out))
