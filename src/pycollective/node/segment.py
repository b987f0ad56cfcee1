"""Memory that every rank of a node maps: :class:`Segment`.

An anonymous ``memfd`` that the other ranks open through ``/proc/<pid>/fd``
(nothing is ever named in ``/dev/shm``), or, where that is not possible, a
POSIX shared-memory object that is unlinked as soon as every rank has it
mapped.  Either way nothing is left behind when the processes end, and no
MPI window is used: MPI implementations limit their number and some crash
beyond it, while a mapping costs one entry in the process's memory map.
"""

import mmap
import os
import secrets

import numpy as np

__all__ = ["Segment"]


class Segment:
    """``nbytes`` of memory mapped by every rank of a node (see the module docstring).

    Build it with :meth:`share`, collectively; free it by dropping every
    reference (the mapping goes when the last view of it goes).
    """

    __slots__ = ("mm", "nbytes")

    def __init__(self, mm, nbytes):
        self.mm, self.nbytes = mm, nbytes

    def words(self):
        """The whole segment as int64 words."""
        return np.frombuffer(self.mm, np.int64, self.nbytes // 8)

    def bytes(self):
        return np.frombuffer(self.mm, np.uint8, self.nbytes)

    @classmethod
    def share(cls, nbytes, rank, bcast, all_ok):
        """Create on rank 0, map on every rank; collective through the two callables.

        Args:
            nbytes: size of the segment.
            rank: this rank among the node's ranks (0 creates).
            bcast: ``bcast(value)`` -> rank 0's value on every rank.
            all_ok: ``all_ok(flag)`` -> True on every rank iff every flag was True.

        Raises:
            OSError: the ranks cannot share memory (the same on every rank).
        """
        nbytes = -(-max(nbytes, 8) // mmap.PAGESIZE) * mmap.PAGESIZE
        mm = None
        fd, info = None, None
        if rank == 0 and hasattr(os, "memfd_create"):
            try:
                fd = os.memfd_create("pycollective", getattr(os, "MFD_CLOEXEC", 0))
                os.ftruncate(fd, nbytes)
                mm = mmap.mmap(fd, nbytes)
                info = (os.getpid(), fd)
            except OSError:
                info = None
        info = bcast(info)
        if info is not None and rank != 0:
            mm = _mapped(lambda: os.open("/proc/%d/fd/%d" % info, os.O_RDWR), nbytes)
        ok = all_ok(mm is not None)
        if fd is not None:
            os.close(fd)  # every rank holds its own mapping now (or none)
        if ok:
            return cls(mm, nbytes)
        mm = None
        return cls._share_by_name(nbytes, rank, bcast, all_ok)

    @classmethod
    def _share_by_name(cls, nbytes, rank, bcast, all_ok):
        import _posixshmem  # CPython's shm_open/shm_unlink (what multiprocessing uses)
        mm, name = None, None
        flags = os.O_RDWR
        if rank == 0:
            name = f"/pycollective-{os.getpid()}-{secrets.token_hex(6)}"
            mm = _mapped(lambda: _posixshmem.shm_open(name, flags | os.O_CREAT | os.O_EXCL,
                                                      mode=0o600), nbytes, size=True)
            if mm is None:  # created but not sized or mapped (a full /dev/shm): remove it
                _unlink(_posixshmem, name)
                name = None
        name = bcast(name)
        if name is not None and rank != 0:
            mm = _mapped(lambda: _posixshmem.shm_open(name, flags, mode=0o600), nbytes)
        ok = all_ok(mm is not None)
        if rank == 0 and name is not None:
            _unlink(_posixshmem, name)  # mapped everywhere (or failed): no name left behind
        if not ok:
            raise OSError("the ranks of this node cannot share memory (neither memfd through "
                          "/proc nor POSIX shared memory worked)")
        return cls(mm, nbytes)


def _mapped(open_fd, nbytes, size=False):
    """``nbytes`` mapped from the descriptor ``open_fd()`` returns (sized first if ``size``),
    which is closed again; None if the system refuses any of it."""
    try:
        fd = open_fd()
        try:
            if size:
                os.ftruncate(fd, nbytes)
            return mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
    except OSError:
        return None


def _unlink(posixshmem, name):
    """Remove the shared-memory object ``name``; one that was never created is no error."""
    try:
        posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass
