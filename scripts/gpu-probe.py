"""CUDA IPC probe: what the driver of this machine does with legacy IPC handles.

Sluice's GPU path rests on these behaviours (docs/gpu.md); this probe records them on a
real GPU through the driver API (ctypes on libcuda, nothing else), independent of
Sluice's own code:

* cross_process: another process opens a memory handle and an interprocess event handle,
  waits on the event and reads the bytes the exporter wrote;
* same_process_open: the exporter opens its own memory handle (expected to fail, which is
  why Sluice keeps a registry of its own exports);
* double_open: a second process opens the same handle twice;
* after_exporter_exit: a process opens a handle whose exporter has exited, and reads
  through a mapping it opened before the exit.

Prints one JSON object; exit code 0 when the cross-process check passed.
Usage: python3 gpu-probe.py [--out FILE]
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time

CU_EVENT_DISABLE_TIMING = 0x2
CU_EVENT_INTERPROCESS = 0x4
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
SIZE = 1 << 20


class Handle(ctypes.Structure):
    # Bytes, not c_char: a c_char array reads back cut at its first NUL byte, and handles
    # have NUL bytes.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    # Prototypes: without them ctypes passes Python ints as 32-bit C ints, which truncates
    # device pointers (CUdeviceptr is 64-bit) and crashes the process.
    c = ctypes
    ptr, size, handle = c.c_uint64, c.c_size_t, Handle
    for fn, args in {
        "cuInit": [c.c_uint],
        "cuDeviceGet": [c.POINTER(c.c_int), c.c_int],
        "cuDevicePrimaryCtxRetain": [c.POINTER(c.c_void_p), c.c_int],
        "cuCtxSetCurrent": [c.c_void_p],
        "cuCtxSynchronize": [],
        "cuGetErrorName": [c.c_int, c.POINTER(c.c_char_p)],
        "cuMemAlloc_v2": [c.POINTER(ptr), size],
        "cuMemsetD8_v2": [ptr, c.c_ubyte, size],
        "cuIpcGetMemHandle": [c.POINTER(handle), ptr],
        "cuIpcOpenMemHandle_v2": [c.POINTER(ptr), handle, c.c_uint],
        "cuIpcCloseMemHandle": [ptr],
        "cuEventCreate": [c.POINTER(c.c_void_p), c.c_uint],
        "cuEventRecord": [c.c_void_p, c.c_void_p],
        "cuIpcGetEventHandle": [c.POINTER(handle), c.c_void_p],
        "cuIpcOpenEventHandle": [c.POINTER(c.c_void_p), handle],
        "cuStreamWaitEvent": [c.c_void_p, c.c_void_p, c.c_uint],
        "cuMemcpyDtoH_v2": [c.c_void_p, ptr, size],
    }.items():
        f = getattr(cuda, fn)
        f.argtypes, f.restype = args, c.c_int
    check(cuda, cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda, cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return cuda


def name(cuda, code: int) -> str:
    text = ctypes.c_char_p()
    cuda.cuGetErrorName(code, ctypes.byref(text))
    return text.value.decode() if text.value else str(code)


def check(cuda, code: int, call: str) -> None:
    if code != 0:
        raise RuntimeError(f"{call} failed: {name(cuda, code)}")


def export(cuda):
    """Allocates SIZE bytes filled with 0xAB and an interprocess event recorded after it."""
    ptr = ctypes.c_uint64()
    check(cuda, cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(SIZE)), "cuMemAlloc")
    check(cuda, cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0xAB), ctypes.c_size_t(SIZE)), "cuMemsetD8")
    mem = Handle()
    check(cuda, cuda.cuIpcGetMemHandle(ctypes.byref(mem), ptr), "cuIpcGetMemHandle")
    ev = ctypes.c_void_p()
    flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING
    check(cuda, cuda.cuEventCreate(ctypes.byref(ev), flags), "cuEventCreate")
    check(cuda, cuda.cuEventRecord(ev, None), "cuEventRecord")
    evh = Handle()
    check(cuda, cuda.cuIpcGetEventHandle(ctypes.byref(evh), ev), "cuIpcGetEventHandle")
    check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return ptr, bytes(mem.reserved), bytes(evh.reserved)  # all 64 bytes of each


def open_mem(cuda, handle: bytes):
    h = Handle()
    ctypes.memmove(ctypes.byref(h), handle, 64)
    p = ctypes.c_uint64()
    code = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return code, p


def read_first(cuda, p) -> tuple[int, bytes]:
    out = (ctypes.c_ubyte * 16)()
    code = cuda.cuMemcpyDtoH_v2(out, p, ctypes.c_size_t(16))
    return code, bytes(out)


def importer(mem_hex: str, ev_hex: str) -> dict:
    cuda = driver()
    result: dict = {}
    code, p = open_mem(cuda, bytes.fromhex(mem_hex))
    result["open"] = name(cuda, code)
    if code == 0:
        h = Handle()
        ctypes.memmove(ctypes.byref(h), bytes.fromhex(ev_hex), 64)
        ev = ctypes.c_void_p()
        result["open_event"] = name(cuda, cuda.cuIpcOpenEventHandle(ctypes.byref(ev), h))
        if ev.value:
            result["wait_event"] = name(cuda, cuda.cuStreamWaitEvent(None, ev, 0))
        code, data = read_first(cuda, p)
        result["read"] = name(cuda, code)
        result["bytes_ok"] = data == b"\xab" * 16
        code2, p2 = open_mem(cuda, bytes.fromhex(mem_hex))
        result["double_open"] = name(cuda, code2)
        result["double_open_same_address"] = code2 == 0 and p2.value == p.value
        if code2 == 0:
            cuda.cuIpcCloseMemHandle(p2)
        # Wait for the exporter to exit (the parent closes our stdin once it has).
        sys.stdin.readline()
        code, data = read_first(cuda, p)
        result["read_after_exporter_exit"] = name(cuda, code)
        result["bytes_after_exporter_exit_ok"] = data == b"\xab" * 16
        code3, p3 = open_mem(cuda, bytes.fromhex(mem_hex))
        result["open_after_exporter_exit"] = name(cuda, code3)
        if code3 == 0:
            cuda.cuIpcCloseMemHandle(p3)
        result["close"] = name(cuda, cuda.cuIpcCloseMemHandle(p))
    return result


def exporter() -> None:
    """Exports, prints the handles, stays alive until stdin closes."""
    cuda = driver()
    ptr, mem, ev = export(cuda)
    code, _ = open_mem(cuda, mem)
    print(json.dumps({"mem": mem.hex(), "ev": ev.hex(), "same_process_open": name(cuda, code)}))
    sys.stdout.flush()
    sys.stdin.readline()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--exporter":
        exporter()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--importer":
        print(json.dumps(importer(sys.argv[2], sys.argv[3])))
        return 0
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    started = time.monotonic()
    python = [sys.executable, "-X", "faulthandler", __file__]
    exp = subprocess.Popen([*python, "--exporter"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    line = exp.stdout.readline()
    if not line:
        _, err = exp.communicate(timeout=60)
        print(json.dumps({"exporter": f"exit {exp.returncode}", "stderr": err[-3000:]}))
        return 1
    handles = json.loads(line)
    imp = subprocess.Popen([*python, "--importer", handles["mem"], handles["ev"]],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    # Let the importer open and read, then end the exporter and tell the importer.
    time.sleep(2.0)
    exp.stdin.close()
    exp.wait(timeout=60)
    try:
        imp_out, imp_err = imp.communicate("go\n", timeout=60)
    except (BrokenPipeError, OSError):
        imp_out, imp_err = imp.communicate(timeout=60)
    result = {
        "same_process_open": handles["same_process_open"],
        "importer": (json.loads(imp_out) if imp_out.strip() else
                     {"error": f"exit {imp.returncode}", "stderr": imp_err[-3000:]}),
        "seconds": round(time.monotonic() - started, 3),
    }
    result["cross_process_ok"] = result["importer"].get("bytes_ok") is True
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 0 if result["cross_process_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
