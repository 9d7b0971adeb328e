"""Evicting files from the page cache and checking that they are gone, for cold-read benchmarks.

    evict(paths)              fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED) on every file
    resident_bytes(paths)     bytes of the files in the page cache now (mincore on a mapping)
    evict_checked(paths)      evict, then measure what stayed: (file bytes, resident bytes after)

DONTNEED drops clean, unmapped pages. Dirty pages are written first (fdatasync); pages another process
has mapped or locked stay, and some file systems (tmpfs, overlay on tmpfs) cannot drop pages at all:
`evict_checked` reports what stayed so a benchmark can say so instead of calling warm reads cold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PAGE = mmap.PAGESIZE


def evict(paths: Iterable[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(paths: Iterable[str]) -> int:
    """Bytes of `paths` in the page cache, page by page (mincore), without reading them."""
    total = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            try:
                pages = (size + _PAGE - 1) // _PAGE
                vec = ctypes.create_string_buffer(pages)
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {path}")
                resident = sum(b & 1 for b in vec.raw)
                total += min(size, resident * _PAGE)
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def evict_checked(paths: list[str]) -> tuple[int, int]:
    """Evicts `paths`; returns (their bytes, bytes still resident afterwards)."""
    evict(paths)
    return sum(os.path.getsize(p) for p in paths), resident_bytes(paths)


def files_under(folder: str) -> list[str]:
    return sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)
