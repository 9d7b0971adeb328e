"""Holds files' pages in the page cache for the length of a `with` block (mapped and locked).

Why tests need it: a machine may evict page cache that was just read without any memory pressure.
The VMs these tests run on do: a DAMON scheme pages out unmapped file pages in regions it sampled
as idle (`/sys/kernel/mm/damon/admin/kdamonds/*/contexts/*/schemes`, action `pageout`), and its
regions are megabytes wide, so pages read a second ago can go when their region looked idle. A test
that asserts "the warm epoch read nothing from the server" checks what the loader reads, not what
the kernel keeps; holding the pages removes the kernel's share. What it cannot hide: a loader
that bypasses the page cache (O_DIRECT, a read of its own from the server) still reads bytes."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


@contextlib.contextmanager
def pages_held(paths: Iterable[Path]) -> Iterator[None]:
    """Maps each file and locks its pages (reading any that are not cached).
    Raises OSError naming the file when a map or lock fails (mlock needs CAP_IPC_LOCK or room under
    RLIMIT_MEMLOCK)."""
    held: list[tuple[int, int]] = []
    try:
        for path in paths:
            size = os.path.getsize(path)
            if size == 0:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            finally:
                os.close(fd)  # the mapping keeps the file
            if addr is None or addr == _MAP_FAILED:
                err = ctypes.get_errno()
                raise OSError(err, f"mmap of {path} to hold its pages: {os.strerror(err)}")
            held.append((addr, size))
            if _libc.mlock(addr, size) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mlock of {path} ({size} bytes) to hold its pages: {os.strerror(err)}")
        yield
    finally:
        for addr, size in held:
            _libc.munmap(addr, size)  # unlocks too
