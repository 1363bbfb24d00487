"""No orphans: every process the launcher starts ends when the process that started it ends,
however that one ended (an exception, SIGTERM, SIGKILL, a closed terminal).

The kernel does it, not a watcher: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``,
prctl(2): "the signal that the calling process will get when its parent dies"), set in each
child before it runs anything else:
- torchrun (and the memory-trace helper) get SIGKILL when the launcher dies (``preexec``);
- each rank gets SIGKILL when torchrun dies (``die_with_parent``, first thing in
  ``qwen3_trainium.rank.train``). torch's elastic agent starts every rank in a session of its own
  (``SubprocessHandler._popen``, ``start_new_session=True``), so a signal to torchrun's process
  group never reached them: this is what left ranks running for 15 minutes after the launcher
  was killed.
The setting survives ``execve`` (prctl(2): cleared only for set-user-ID binaries), and a child
that finds its parent already gone when it sets it leaves at once (the race prctl(2) warns of).
Elsewhere than Linux nothing is set (``supported`` is False): the launcher's own signal handling
(``parent/signals.py``, ``rank/stop.py``) is all there is. Only the standard library: ranks import this before torch.

Between ``fork`` and ``exec`` the child may only do what takes no lock and reads no state another
thread could have held or been changing at the fork (Python's ``subprocess`` docs: ``preexec_fn``
"is not safe to use in the presence of threads ... the child process could deadlock before exec is
called"; POSIX ``fork``: such a child may call only async-signal-safe functions, which ``dlopen``
and ``dlsym`` are not). The launcher has threads then (the progress line, the plotter, name lookups
left running by ``reachable``, which may themselves load NSS modules). glibc re-initialises the
loader's lock in the child (``sysdeps/nptl/fork.c``) but not the lists it guards. So libc's
``prctl`` is looked up here, once, at import in the parent; after the fork the child calls only
that bound function, ``getppid`` and ``_exit``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_ENV = "QWEN3_TRAINIUM_LAUNCHER_PID"  # the launcher's pid, for a rank to check its grandparent


def supported() -> bool:
    return sys.platform.startswith("linux")


def _bind_prctl():
    """libc's ``prctl`` as a ctypes function, its argument types set; None where there is none.
    ``dlopen`` and ``dlsym`` run here, in the parent: never after a fork (module docstring)."""
    if not supported():
        return None
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _bind_prctl()  # at import: the launcher imports this long before it starts a process


def _prctl_pdeathsig(signum: int) -> bool:
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from ``/proc`` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def preexec(parent_pid: int, signum: int = signal.SIGKILL):
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``signum`` when ``parent_pid``
    (the caller, which is blocked in ``Popen`` meanwhile) dies. Everything is looked up here, in
    the parent; after the fork the child makes three system calls and nothing else."""
    prctl, signum = _PRCTL, int(signum)
    if prctl is None:
        return _nothing
    getppid, leave = os.getppid, os._exit

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if getppid() != parent_pid:
            leave(1)

    return setup


def _nothing() -> None:
    """The ``preexec_fn`` where no parent-death signal can be set (not Linux, no ``prctl``)."""


def die_with_parent(environ=os.environ, signum: int = signal.SIGKILL) -> None:
    """In a rank: end with ``signum`` when torchrun ends. If torchrun is already gone (this rank's
    parent is no longer a child of the launcher named in the environment), leave now."""
    if not supported():
        return
    _prctl_pdeathsig(signum)
    launcher = environ.get(PARENT_ENV)
    if launcher and parent_of(os.getppid()) != int(launcher):
        print("[qwen3-trainium] torchrun ended before this rank started; stopping", file=sys.stderr)
        os._exit(1)
