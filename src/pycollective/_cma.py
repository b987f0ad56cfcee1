"""Reading another rank's private memory by address: Linux cross-memory attach.

``process_vm_readv`` copies straight from a peer process's buffer into ours,
so a shared-memory algorithm can read the others' inputs where they are
instead of staging them in a shared window first: the data cross memory
once.  It needs Linux, the same user and ptrace permission between the
ranks; :meth:`CrossMemory.probe` finds out collectively, so all ranks take
the same path.
"""

import ctypes
import os

import numpy as np
from mpi4py import MPI

__all__ = ["CrossMemory", "available"]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_readv():
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


_readv = _load_readv()


def available():
    """True if this system has ``process_vm_readv`` at all (not whether peers allow it)."""
    return _readv is not None


class CrossMemory:
    """Reads of another rank's private memory by address (``process_vm_readv``).

    Ranks publish their buffer addresses in a small shared window; a reader
    copies straight from the owner's array, so no rank has to stage its input
    in shared memory first.  Usable only where the system allows it (Linux,
    same user, ptrace permitted); :meth:`probe` finds out collectively, so all
    ranks take the same path.
    """

    def __init__(self, node):
        self.node = node  # its flag barrier is our sync
        comm = self.comm = node.comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.win = MPI.Win.Allocate_shared(64, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.headers = [np.frombuffer(self.win.Shared_query(q)[0], np.int64, 8)
                        for q in range(self.size)]
        self.headers[self.rank][0] = os.getpid()
        self._local, self._remote = _IoVec(), _IoVec()
        self._tmp = np.empty(0, np.uint8)
        self.sync()
        self.pids = [int(h[0]) for h in self.headers]

    def sync(self):
        self.win.Sync()
        self.node.sync()
        self.win.Sync()

    def publish(self, src, dst):
        header = self.headers[self.rank]
        header[1] = src.ctypes.data
        header[2] = dst.ctypes.data

    def read(self, q, address, out):
        """Copy ``out.nbytes`` bytes at ``address`` in rank q's memory into ``out``."""
        done, total, base = 0, out.nbytes, out.ctypes.data
        local, remote = self._local, self._remote
        while done < total:
            local.base, local.len = base + done, total - done
            remote.base, remote.len = address + done, total - done
            got = _readv(self.pids[q], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv from rank {q}: {os.strerror(err)}")
            done += got

    def scratch(self, nbytes):
        if self._tmp.nbytes < nbytes:
            self._tmp = np.empty(nbytes, np.uint8)
        return self._tmp

    def probe(self):
        """True on every rank iff every rank can read its right neighbour's memory."""
        mark = np.array([0x5EED0000 + self.rank], np.int64)
        self.headers[self.rank][1] = mark.ctypes.data
        self.sync()
        right = (self.rank + 1) % self.size
        got = np.zeros(1, np.int64)
        try:
            self.read(right, int(self.headers[right][1]), got)
            ok = int(got[0]) == 0x5EED0000 + right
        except OSError:
            ok = False
        ok = self.comm.allreduce(ok, op=MPI.LAND)  # also keeps `mark` alive until all read
        return ok

    def free(self):
        self.win.Unlock_all()
        self.win.Free()

