"""torch DDP communication hooks that average gradient buckets through pycollective.

A torch CPU training script launched with ``mpiexec`` switches DDP's
gradient averaging from its process group (Gloo on CPUs) to pycollective by
two lines::

    state = pycollective.torch.HookState(MPI.COMM_WORLD)               # 1. the communicator
    ddp.register_comm_hook(state, pycollective.torch.allreduce_hook)    # 2. the hook

DDP keeps its process group for what it does once (the initial parameter
broadcast, ``find_unused_parameters`` bookkeeping); every gradient bucket of
every step goes through the hook.  :func:`init_process_group` sets that
group up on the ranks of an mpi4py communicator for scripts that have none.

How a bucket travels
--------------------
DDP calls the hook on its autograd thread as soon as a bucket's gradients
are ready, while backward goes on computing earlier layers, and waits for
the returned future only at the end of backward.  The hook divides the
bucket's flat tensor by N (before the sum, as torch's own hook does, so
float16 partial sums stay in range) and starts
``pycollective.Comm(...).Iallreduce(MPI.IN_PLACE, tensor)`` on it: a CPU
tensor is viewed in place through DLPack, never copied; a CUDA bucket is
staged through pinned host memory in overlapping chunks, and its future is
completed only after the copy back (:mod:`pycollective.device`).  The reduction runs
on the drop-in's helper thread (:mod:`pycollective.comm`), one bucket after
the other in the order DDP submits them, which is the same on every rank.
The helper waits in MPI and reduces in numba kernels without holding the
GIL, so backward's torch operators (which do not hold it either) run at the
same time: that is the overlap, bounded by the two having to share the
cores (on the 2-core machine of docs/torch.md, where backward keeps every
core busy, it gains nothing and ``overlap=False`` is faster).  The request gives no completion callback, so each :class:`HookState`
has one small thread that waits for the requests in submission order and
completes each bucket's ``torch.futures.Future`` (one more thread wake-up
per bucket).  The last bucket of a step (``bucket.is_last()``) is reduced
on the calling thread with the blocking ``Allreduce``, once the buckets
before it are done: backward has nothing left to compute, so handing it to
the helper would only add the two wake-ups to the step, and running it
beside the helper's reductions would have two threads of each rank polling
MPI and taking the GIL from each other (the step's reductions took several
times longer).  A model whose gradients fit in one bucket (DDP's
first bucket holds 1 MiB, the others 25 MiB) therefore has no overlap and
no thread hand-off at all.

Errors do not hang: a rank whose call cannot start, a count that differs
across ranks, a peer that stalls past pycollective's timeout
(:func:`pycollective.set_timeout`, ``PYCOLLECTIVE_TIMEOUT_S``) end the
request with an exception on every rank, and the hook sets it on the
future; DDP raises it from ``loss.backward()`` in the training script.

Compression (:func:`fp16_compress_hook`, :func:`bf16_compress_hook`) uses
the library's two-byte transport (:mod:`pycollective.compression`):
gradients are divided by N and rounded once to the two-byte format, partial
sums travel in two bytes but are formed in float64, and the result is
written back into the bucket in its own dtype.

torch is imported when a hook state is built, not with pycollective: ``import
pycollective`` never imports torch, and without torch these functions raise
ImportError saying how to install it.
"""

import os
import queue
import socket
import threading

from mpi4py import MPI

from .runtime import threads as _threads
from . import compression as _compression
from .runtime.root import bcast_from_root
from .comm.dropin import Comm, Request
from . import timeline as _timeline

__all__ = ["HookState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "init_process_group"]


def _torch():
    """The torch module; ImportError naming the fix when it is missing."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError("pycollective.torch needs torch (pip install torch; the CPU wheel "
                          "suffices: pip install torch --index-url "
                          "https://download.pytorch.org/whl/cpu)") from exc
    return torch


class _Mean(_compression.Cast):
    """A two-byte cast that leaves the reduced bucket divided by N: DDP's mean.

    The library's casts divide by N while compressing (fp16, to stay in
    range) and multiply back while decompressing, giving the sum; DDP wants
    the mean, so this one always divides and never multiplies back: one
    rounding fewer than a sum followed by a division.
    """

    def __init__(self, base):
        super().__init__(base.name, base.wire, divide_first=True)

    def compress(self, array, divide=1):
        buf, (dtype, _) = super().compress(array, divide)
        return buf, (dtype, 1)

    def error_bound(self, abs_sum, nranks):
        """Largest |hook's mean - exact mean| per element (``abs_sum``: Σ|x_i| over ranks).

        The cast's bound on the sum is N times its bound on the divided sum,
        plus the multiplication this one leaves out; dividing it by N bounds
        the mean.
        """
        return super().error_bound(abs_sum, nranks) / max(int(nranks), 1)


_MEANS = {"fp16": _Mean(_compression.FP16), "bf16": _Mean(_compression.BF16)}


class _Completer:
    """One thread that completes each bucket's future when its request has finished.

    Requests run in submission order on the drop-in's helper, so waiting for
    them in that order never waits behind one that finished later.
    """

    def __init__(self):
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pycollective-torch-futures",
                                       daemon=True)
        self.thread.start()

    def add(self, request, future, result):
        self.queue.put((request, future, result))

    def _run(self):
        while True:
            request, future, result = self.queue.get()
            try:
                request.Wait()
            except BaseException as exc:  # noqa: BLE001  (DDP raises it from backward)
                future.set_exception(exc)
            else:
                future.set_result(result)


class HookState:
    """What the hooks need: the communicator of DDP's ranks and how to reduce on it.

    Args:
        comm: an mpi4py intracommunicator holding the same processes as
            DDP's process group (``MPI.COMM_WORLD`` when both span the job),
            or a :class:`pycollective.Comm` (its algorithm is then used
            unless ``algorithm`` names one).
        algorithm: "auto" (pycollective's choice per bucket size), an
            allreduce algorithm name (:func:`pycollective.algorithms`), or a
            ``pycollective.Comm`` algorithm mapping.
        average: True (DDP's convention): each bucket becomes the mean over
            the ranks; False: the sum (for a loss already divided by the
            global batch, or integer buckets).
        overlap: True: buckets before the last are reduced on the helper
            thread while backward goes on; False: every bucket is reduced
            at once on the calling thread (no overlap, no thread hand-off:
            better where ranks already keep every core busy).

    Raises:
        ImportError: torch is not installed.
        TypeError: ``comm`` is not an intracommunicator.
        ValueError: unknown algorithm.
    """

    def __init__(self, comm=None, algorithm="auto", *, average=True, overlap=True):
        self._torch = _torch()
        # timeline hook: every collective a record_function range in torch.profiler traces
        _timeline.use_torch_profiler(self._torch.autograd.profiler.record_function,
                                     self._torch.autograd._profiler_enabled)
        comm = MPI.COMM_WORLD if comm is None else comm
        if algorithm == "auto" and isinstance(comm, Comm) and comm.algorithm is not None:
            algorithm = comm.algorithm
        self.comm = Comm(comm, algorithm=algorithm)
        self.algorithm, self.average, self.overlap = algorithm, bool(average), bool(overlap)
        self.size = self.comm.Get_size()
        self._compressed = {}
        self._completer = None
        self._pending = None
        self._lock = threading.Lock()

    def __repr__(self):
        return (f"<pycollective.torch.HookState size={self.size} algorithm={self.algorithm} "
                f"average={self.average} overlap={self.overlap}>")

    def _comm(self, compress):
        """The drop-in communicator that reduces with ``compress`` (None: uncompressed)."""
        if compress is None:
            return self.comm
        found = self._compressed.get(compress)
        if found is None:
            # Same handle, so the same helper thread and queue: buckets of
            # both kinds stay in one order.
            cast = _MEANS[compress] if self.average else compress
            found = self._compressed[compress] = Comm(self.comm, algorithm=self.algorithm,
                                                      compress=cast)
        return found

    def _complete(self, request, future, result):
        with self._lock:  # DDP may call hooks from several autograd threads
            if self._completer is None:
                self._completer = _Completer()
        self._completer.add(request, future, result)
        self._pending = (request, future)

    def _drain(self):
        """Wait until the buckets handed to the helper are reduced (their errors are theirs).

        The helper runs them in order, so the last one's end is all's end.
        A drop-in request's job event is set by the helper itself: waiting
        on it wakes this thread directly, one scheduling hop instead of two
        (helper -> completer -> here), which costs milliseconds when ranks
        outnumber cores.  A native request (no MPI_THREAD_MULTIPLE) is
        waited for through its future.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        request, future = pending
        if isinstance(request, Request):
            job = request._job  # None once the completer has finished it
            if job is not None:
                job.event.wait()
            return
        try:
            future.wait()
        except Exception:  # noqa: BLE001  (reported by that bucket's own future)
            pass


def _value(future):
    return future.value()


def _is_last(bucket):
    is_last = getattr(bucket, "is_last", None)
    return bool(is_last()) if is_last is not None else False


def _reduce(state, bucket, compress):
    """Start the reduction of ``bucket.buffer()``; a future completed with that tensor."""
    if not isinstance(state, HookState):
        raise TypeError("register the hook with a pycollective.torch.HookState as its state, "
                        f"e.g. HookState(MPI.COMM_WORLD); got {type(state).__name__}")
    torch = state._torch
    tensor = bucket.buffer()
    future = torch.futures.Future()
    # DDP reads a failed future from C++, where a Python exception set on it
    # becomes "Unable to cast ... to Tensor"; re-raised by a ``then``
    # callback it reaches backward() as an error naming the exception.
    result = future.then(_value)
    try:
        if compress is not None and not tensor.is_floating_point():
            raise TypeError(f"{compress} compression needs a floating bucket, got {tensor.dtype}")
        if state.average and compress is None and state.size > 1:
            if not tensor.is_floating_point():
                raise TypeError(f"cannot average a {tensor.dtype} bucket in place; use "
                                "HookState(..., average=False) to sum it")
            # Divide before the sum, as torch's hook does: the sum of N
            # gradients can leave a narrow format's range where each does not.
            tensor.div_(state.size)
        comm = state._comm(compress)
        if not state.overlap or _is_last(bucket):
            # Backward has nothing left to compute: reducing here saves the
            # hand-offs to the helper thread and back.
            state._drain()
            # DDP may run this on any of its autograd threads: pair by the hook, not by them.
            with _threads.pairing("pycollective-ddp-hook"):
                comm.Allreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)
            future.set_result(tensor)
            return result
        request = comm.Iallreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)
    except Exception as exc:  # noqa: BLE001  (DDP raises it from backward)
        # The checks above read only the dtype, the same on every rank; a
        # call the drop-in could not start has joined the collective with an
        # invalid argument, so the other ranks' calls fail too, never wait.
        future.set_exception(exc)
        return result
    state._complete(request, future, tensor)
    return result


def _ranged(state, hook, bucket):
    """The hook's call as a ``record_function`` range (cheap while torch's profiler is off)."""
    index = getattr(bucket, "index", None)
    name = f"pycollective.torch.{hook} bucket {index()}" if index is not None else hook
    torch = getattr(state, "_torch", None) or _torch()
    return torch.autograd.profiler.record_function(name)


def allreduce_hook(state: HookState, bucket):
    """DDP communication hook: average the bucket over ``state``'s ranks through pycollective.

    Register with ``ddp.register_comm_hook(HookState(comm), allreduce_hook)``.

    Args:
        state: a :class:`HookState`.
        bucket: DDP's ``torch.distributed.GradBucket``.

    Returns:
        A ``torch.futures.Future`` completed with the bucket's tensor,
        averaged in place, or with the reduction's exception.
    """
    with _ranged(state, "allreduce_hook", bucket):  # timeline hook: the hook's call
        return _reduce(state, bucket, None)


def fp16_compress_hook(state: HookState, bucket):
    """As :func:`allreduce_hook`, the bucket travelling as float16 (divided by N first).

    Errors stay within :meth:`pycollective.compression.Cast.error_bound`
    divided by N (the mean's bound), about N·2^-11 of the mean's magnitude.
    """
    with _ranged(state, "fp16_compress_hook", bucket):  # timeline hook: the hook's call
        return _reduce(state, bucket, "fp16")


def bf16_compress_hook(state: HookState, bucket):
    """As :func:`allreduce_hook`, the bucket travelling as bfloat16 (float32's range).

    Errors stay within N·2^-8 of the mean's magnitude, roughly (the bound
    as for :func:`fp16_compress_hook`).
    """
    with _ranged(state, "bf16_compress_hook", bucket):  # timeline hook: the hook's call
        return _reduce(state, bucket, "bf16")


def init_process_group(comm=None, backend="gloo", **kwargs):
    """Start torch.distributed's default process group on the ranks of ``comm``.

    For scripts launched by ``mpiexec`` (no ``torchrun`` environment): rank 0
    opens torch's TCP store on a free port of ``MASTER_ADDR`` (default
    127.0.0.1 when the ranks share one host, else rank 0's host name) and
    sends the port to the others through ``comm``; process group rank q is
    ``comm``'s rank q.  On one host ``GLOO_SOCKET_IFNAME`` defaults to the
    loopback interface (Gloo otherwise picks the interface of the host
    name, which containers often cannot reach).

    Args:
        comm: mpi4py intracommunicator (default ``MPI.COMM_WORLD``).
        backend: torch.distributed backend ("gloo" on CPUs).
        **kwargs: passed to ``torch.distributed.init_process_group``.

    Returns:
        The default process group.

    Raises:
        ImportError: torch is not installed.
        RuntimeError: on every rank if rank 0 could not open the store.
    """
    torch = _torch()
    dist = torch.distributed
    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
    host = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if one_host else None)
    if one_host:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = None

    def open_store():
        nonlocal store
        store = dist.TCPStore(host or "0.0.0.0", 0, size, is_master=True,
                              wait_for_workers=False)
        return (host or socket.gethostname(), store.port)

    try:
        addr, port = bcast_from_root(comm, open_store)
    except ValueError as exc:
        raise RuntimeError(f"rank 0 could not open torch's TCP store: {exc}") from None
    if rank != 0:
        store = dist.TCPStore(addr, port, size, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, **kwargs)
    return dist.group.WORLD
