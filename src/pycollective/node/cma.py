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

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


__all__ = ["CrossMemory", "available", "read_at"]


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


@intrinsic
def _process_vm_readv(typingctx, pid, iovecs):
    # libc's process_vm_readv of one local and one remote iovec (``iovecs``: the address of
    # four words: local base and length, remote base and length), resolved when the code
    # is linked into the process (so the compiled caller can be cached)
    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        ptr = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i32, ptr, i64, ptr, i64, i64]),
            "process_vm_readv")
        local = builder.inttoptr(args[1], ptr)
        remote = builder.inttoptr(builder.add(args[1], ir.Constant(i64, 16)), ptr)
        one, zero = ir.Constant(i64, 1), ir.Constant(i64, 0)
        return builder.call(fn, [builder.trunc(args[0], i32), local, one, remote, one, zero])
    return types.int64(types.int64, types.intp), codegen


@numba.njit(cache=True, nogil=True)
def read_at(pid, remote, local, nbytes, iovecs):
    """:meth:`CrossMemory.read`'s copy from compiled code: ``nbytes`` at address ``remote``
    of process ``pid`` to address ``local`` (``iovecs``: four int64 words of scratch).
    0 once done, -1 if the kernel refused (the caller reads again through
    :meth:`CrossMemory.read` for the error).  The caller checks the range."""
    at = iovecs.ctypes.data
    done = 0
    while done < nbytes:
        iovecs[0], iovecs[1] = local + done, nbytes - done
        iovecs[2], iovecs[3] = remote + done, nbytes - done
        got = _process_vm_readv(pid, at)
        if got <= 0:
            return -1
        done += got
    return 0


def available():
    """True if this system has ``process_vm_readv`` at all (not whether peers allow it)."""
    return _readv is not None


class CrossMemory:
    """Reads of another rank's private memory by address (``process_vm_readv``).

    Ranks publish their buffers' addresses and sizes in their headers of a
    :class:`~pycollective.node.group.NodeGroup`; a reader copies straight from
    the owner's array, so no rank has to stage its input in shared memory
    first.  A read is refused unless it lies inside the size the owner
    published, so ranks that disagree on the size can never read past the
    end of a peer's buffer.  Usable only where the system allows it (Linux,
    same user, ptrace permitted); :meth:`probe` finds out collectively, so
    all ranks take the same path.  Collective over the group to create.
    """

    SRC, DST = 1, 2  # which published buffer to read

    def __init__(self, group):
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.headers = group.cma[:, :4]  # pid, src, dst, nbytes
        self.headers[self.rank] = (os.getpid(), 0, 0, 0)
        self._local, self._remote = _IoVec(), _IoVec()
        self.iovecs = np.zeros(4, np.int64)  # read_at's scratch
        self._tmp = np.empty(0, np.uint8)
        group.sync()
        self.pids = [int(h[0]) for h in self.headers]
        self.pid_words = np.array(self.pids, np.int64)  # for compiled readers (read_at)

    def publish(self, src, dst):
        """Make this call's buffers readable (before the call's first sync)."""
        self.headers[self.rank, 1:] = (src.ctypes.data, dst.ctypes.data, dst.nbytes)

    def check(self, q, which, offset, nbytes):
        """Raise ValueError unless bytes ``[offset, offset + nbytes)`` lie inside what rank q
        published (``which`` buffer)."""
        published = int(self.headers[q, 3])
        if offset < 0 or offset + nbytes > published:
            raise ValueError(f"refusing to read bytes [{offset}, {offset + nbytes}) of node "
                             f"rank {q}'s buffer, which has {published} bytes")

    def read(self, q, which, offset, out):
        """Copy ``out.nbytes`` bytes at ``offset`` in rank q's published buffer into ``out``.

        Raises:
            ValueError: the range is not inside what rank q published.
            OSError: the kernel refused the read (e.g. rank q died).
        """
        header = self.headers[q]
        total = out.nbytes
        self.check(q, which, offset, total)
        address = int(header[which]) + offset
        done, base = 0, out.ctypes.data
        local, remote = self._local, self._remote
        while done < total:
            local.base, local.len = base + done, total - done
            remote.base, remote.len = address + done, total - done
            got = _readv(self.pids[q], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv from node rank {q} (pid {self.pids[q]}): "
                                   f"{os.strerror(err)}")
            done += got

    def scratch(self, nbytes):
        if self._tmp.nbytes < nbytes:
            self._tmp = np.empty(nbytes, np.uint8)
        return self._tmp

    def probe(self):
        """True on every rank iff every rank can read its right neighbour's memory."""
        mark = np.array([0x5EED0000 + self.rank], np.int64)
        self.publish(mark, mark)
        self.group.sync()
        right = (self.rank + 1) % self.size
        got = np.zeros(1, np.int64)
        try:
            self.read(right, self.SRC, 0, got)
            ok = int(got[0]) == 0x5EED0000 + right
        except (OSError, ValueError):
            ok = False
        return self.group.all_ok(ok)  # also keeps `mark` alive until every rank has read

    def free(self):
        self.headers = None
