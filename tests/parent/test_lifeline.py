"""The lifeline's child side (``shared/lifeline.py``): between ``fork`` and ``exec`` it looks
nothing up (no ``dlopen``, no ``dlsym``: it calls what the parent bound), and the child still gets
its parent-death signal and dies with its parent, also when another thread of the parent is inside
``dlopen`` at the fork. The oracle is the kernel: ``prctl(PR_GET_PDEATHSIG)`` read by the child
itself, and ``/proc`` after the parent is SIGKILLed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT

from qwen3_trainium.parent import signals
from qwen3_trainium.shared import lifeline

pytestmark = pytest.mark.skipif(not lifeline.supported(), reason="PR_SET_PDEATHSIG is Linux's")

PR_GET_PDEATHSIG = 2  # <linux/prctl.h>
READ_PDEATHSIG = (
    "import ctypes; s = ctypes.c_int();"
    f" ctypes.CDLL(None).prctl({PR_GET_PDEATHSIG}, ctypes.byref(s), 0, 0, 0); print(s.value)"
)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_after_the_fork_the_child_opens_and_looks_up_nothing(monkeypatch, signum):
    """Every ``dlopen`` (``ctypes.CDLL(...)``) and ``dlsym`` (a symbol looked up on a library)
    raises once ``preexec`` has returned in the parent; the child still gets its signal set."""
    tie = lifeline.preexec(os.getpid(), signum)

    def forbidden(*args, **kwargs):
        raise AssertionError("dlopen or dlsym after fork")

    monkeypatch.setattr(ctypes, "_dlopen", forbidden)  # what every CDLL(...) calls
    monkeypatch.setattr(ctypes.CDLL, "__getitem__", forbidden)  # every symbol lookup
    monkeypatch.setattr(ctypes.CDLL, "__getattr__", forbidden)
    child = subprocess.run(
        [sys.executable, "-c", READ_PDEATHSIG], preexec_fn=tie, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == str(int(signum))


# A thread of the parent is inside dlopen for as long as we like: glibc opens and reads a library's
# file under its loader lock (elf/dl-open.c, dl-load.c); a FIFO's open blocks until a writer comes,
# its read until data does. The main thread opens the write end without blocking, which works only
# once the reader is inside open(). (glibc re-initialises that lock in a forked child, so the lookup
# the old lifeline made after the fork passes this case too: the test above is the one it fails.)
PARENT = textwrap.dedent(
    """
    import ctypes, errno, os, subprocess, sys, threading, time
    sys.path.insert(0, {root!r})
    from qwen3_trainium.shared import lifeline

    fifo = sys.argv[1]
    os.mkfifo(fifo)

    # libc's dlopen called through ctypes, which lets go of the GIL (CPython 3.11's CDLL() does not)
    dlopen = ctypes.CDLL(None).dlopen
    dlopen.argtypes, dlopen.restype = (ctypes.c_char_p, ctypes.c_int), ctypes.c_void_p
    threading.Thread(target=dlopen, args=(fifo.encode(), 2), daemon=True).start()  # 2: RTLD_NOW
    while True:
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            assert err.errno == errno.ENXIO, err  # no reader yet
            time.sleep(0.01)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             preexec_fn=lifeline.preexec(os.getpid()))
    print(child.pid, flush=True)
    os.write(writer, b"not an ELF file")
    os.close(writer)
    time.sleep(600)
    """
)


def test_a_child_started_while_a_thread_holds_the_loader_lock_starts_and_dies_with_its_parent(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(root=str(ROOT)), str(tmp_path / "fifo")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a child stuck before exec is in this group: killed with it below
    )
    try:
        ready, _, _ = select.select([parent.stdout], [], [], 120)
        assert ready, "Popen never returned: the child is stuck between fork and exec (a dlopen after fork)"
        child = int(parent.stdout.readline())
        assert signals._alive(child)
        parent.kill()
        parent.wait(timeout=60)
        deadline = time.monotonic() + 30  # the kernel signals at once; only a hang is a failure here
        while signals._alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not signals._alive(child), "the child outlived its parent"
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is empty when all went well
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=60)
