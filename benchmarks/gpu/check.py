"""GPU check of device-buffer staging (issue 32): the matrix, DDP on CUDA, Gloo, the overlap.

One command on the GPU machine (one GPU shared by all ranks)::

    benchmarks/gpu/run.sh OUTDIR            # or: python benchmarks/gpu/check.py --out OUTDIR

and a dry run anywhere, the fake device (host memory standing for CUDA
memory) in place of torch, CuPy and numba, no Gloo, small sizes::

    python benchmarks/gpu/check.py --out OUTDIR --fake

The driver launches the phases below under ``mpiexec``, each bounded by
``timeout``; rank 0 of each launch writes its results as JSON; the driver
writes OUTDIR/summary.md and OUTDIR/results.json and exits 0 when every
check passed and every target was met.

* matrix (2 and 4 ranks): torch tensors, CuPy and numba device arrays
  (whichever are installed) through ``pycollective.allreduce`` (in place,
  device to device, device to host, host to device), the drop-in's
  Allreduce, Iallreduce, Bcast, Allgather, Reduce_scatter_block, at counts
  0, 1, 1001, 1e6+3 and 17e6+1 float32 (68 MB, above 64 MiB), float16,
  float64, int32 (and torch's bfloat16) at 1001, and a tensor made and
  changed on a non-default stream, the call made on that stream.  Every
  result is compared exactly with the expected values (integer-valued data:
  exact in every order).
* ddp (2 ranks): a CUDA model under DDP with each pycollective hook
  (fp32, fp16, bf16), several buckets (the helper thread's path and the
  last bucket's), gradients compared with the mean of every rank's own;
  ``broadcast_parameters`` and ``check_replicas`` on the CUDA parameters.
* perf (2 and 4 ranks): ``pycollective.allreduce(MPI.IN_PLACE, x)`` of CUDA
  float32 tensors of 1e6, 1e7, 1e8 elements against torch Gloo's
  ``all_reduce`` of the same tensors (initialized with a file store in the
  same launch), and at 1e8 the staged call against one device-to-host copy +
  pycollective's host allreduce + one host-to-device copy timed separately.
  Each time is the slowest rank's (after a barrier and a device
  synchronization), the median over repetitions.

Targets: 0 crashes and 0 wrong results; staged >= 1.5x faster than Gloo at
1e6-1e8; at 1e8 staged <= 1.3x the separate sum.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GLOO_TARGET, OVERLAP_TARGET = 1.5, 1.3


# =========================================================================================
# the driver
# =========================================================================================

def _phases(fake):
    # (name, ranks, timeout seconds)
    if fake:
        return [("matrix", 2, 240), ("perf", 2, 240)]
    return [("matrix", 2, 75), ("ddp", 2, 60), ("perf", 2, 75), ("matrix", 4, 75),
            ("perf", 4, 90)]


def drive(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                      env.get("PYTHONPATH", "")]))
    env.setdefault("PYCOLLECTIVE_TIMEOUT_S", "20")  # a stuck rank ends its phase early
    results, t_start = [], time.monotonic()
    phases = _phases(args.fake)
    if args.only:
        phases = [p for p in phases if p[0] in args.only.split(",")]
    for name, nranks, limit in phases:
        left = args.budget - (time.monotonic() - t_start)
        if left < 20:
            results.append({"phase": name, "ranks": nranks, "exit": None, "wall_s": 0,
                            "checks": [], "crash": f"not run: {args.budget}s budget spent"})
            print(f"[check] {name} at {nranks} ranks NOT RUN: budget spent", flush=True)
            continue
        limit = int(min(limit, left - 5))
        json_path = out / f"{name}-{nranks}.json"
        log_path = out / f"{name}-{nranks}.log"
        cmd = ["timeout", "-k", "5", str(limit), args.mpiexec, "-n", str(nranks),
               sys.executable, str(Path(__file__).resolve()), "--worker", name,
               "--json", str(json_path)] + (["--fake"] if args.fake else [])
        print(f"[check +{time.monotonic() - t_start:.0f}s] {name} at {nranks} ranks "
              f"(limit {limit}s)", flush=True)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        wall = time.monotonic() - t0
        entry = {"phase": name, "ranks": nranks, "exit": proc.returncode, "wall_s": round(wall, 1)}
        try:
            entry.update(json.loads(json_path.read_text()))
        except (OSError, ValueError):
            entry["checks"] = []
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            entry["crash"] = f"exit {proc.returncode}" + (" (timeout)" if proc.returncode in
                                                          (124, 137) else "")
            entry["log_tail"] = tail
        results.append(entry)
        bad = [c for c in entry.get("checks", []) if not c["ok"]]
        print(f"[check +{time.monotonic() - t_start:.0f}s]   exit {proc.returncode} in "
              f"{wall:.0f}s; {len(entry.get('checks', []))} checks, {len(bad)} failed"
              + (f"; {entry['crash']}" if "crash" in entry else ""), flush=True)
        for c in bad[:10]:
            print(f"      FAILED {c['name']}: {c.get('detail', '')}", flush=True)
    verdict = summarize(results, args.fake)
    (out / "results.json").write_text(json.dumps({"fake": args.fake, "phases": results,
                                                  "verdict": verdict}, indent=1))
    (out / "summary.md").write_text(render(results, verdict, args))
    print((out / "summary.md").read_text(), flush=True)
    return 0 if verdict["all_met"] else 1


def summarize(results, fake):
    checks = [c for r in results for c in r.get("checks", [])]
    crashes = [f"{r['phase']} at {r['ranks']}: {r['crash']}" for r in results if "crash" in r]
    wrong = [c["name"] for c in checks if not c["ok"]]
    gloo, overlap = [], []
    for r in results:
        for p in r.get("perf", []):
            if p.get("gloo_s"):
                ratio = p["gloo_s"] / p["staged_s"]
                gloo.append({"ranks": r["ranks"], "count": p["count"], "ratio": ratio,
                             "met": ratio >= GLOO_TARGET})
            if p.get("separate_s"):
                ratio = p["staged_s"] / p["separate_s"]
                overlap.append({"ranks": r["ranks"], "count": p["count"], "ratio": ratio,
                                "met": ratio <= OVERLAP_TARGET})
    # A dry run's times are host copies standing for device copies: not judged.
    met = not crashes and not wrong and (fake or (
        gloo and overlap and all(g["met"] for g in gloo) and all(o["met"] for o in overlap)))
    return {"checks": len(checks), "crashes": crashes, "wrong": wrong, "gloo": gloo,
            "overlap": overlap, "all_met": bool(met)}


def render(results, verdict, args):
    lines = ["# GPU check of device-buffer staging" + (" (DRY RUN: fake device)" if args.fake
                                                      else ""), "",
             f"Command: `benchmarks/gpu/run.sh {args.out}`" + (" --fake" if args.fake else ""),
             ""]
    env = next((r.get("env") for r in results if r.get("env")), {})
    if env:
        lines += ["Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    lines += [f"- checks: {verdict['checks']}, wrong results: {len(verdict['wrong'])}, "
              f"crashes: {len(verdict['crashes'])}"]
    for c in verdict["crashes"]:
        lines.append(f"  - crash: {c}")
    for w in verdict["wrong"][:20]:
        lines.append(f"  - wrong: {w}")
    for note in sorted({n for r in results for n in r.get("notes", [])}):
        lines.append(f"- note: {note}")
    lines += ["", "| phase | ranks | exit | wall s | checks | failed |", "|---|---|---|---|---|---|"]
    for r in results:
        cs = r.get("checks", [])
        lines.append(f"| {r['phase']} | {r['ranks']} | {r['exit']} | {r['wall_s']} | {len(cs)} "
                     f"| {sum(not c['ok'] for c in cs)} |")
    perf = [(r["ranks"], p) for r in results for p in r.get("perf", [])]
    if perf:
        lines += ["", "Allreduce of CUDA float32 tensors in place, slowest rank, median "
                  "(ms):", "",
                  "| ranks | count | staged | Gloo | Gloo/staged (>= 1.5) | D2H | host | H2D | "
                  "separate sum | staged/sum (<= 1.3) |", "|---|---|---|---|---|---|---|---|---|---|"]

        def ms(v):
            return "-" if v is None else f"{1e3 * v:.2f}"
        for ranks, p in perf:
            g, s, t = p.get("gloo_s"), p.get("separate_s"), p["staged_s"]
            gloo_ratio = "-" if not g else f"{g / t:.2f}"
            sum_ratio = "-" if not s else f"{t / s:.2f}"
            lines.append(
                f"| {ranks} | {p['count']:.0e} | {ms(t)} | {ms(g)} | {gloo_ratio} | "
                f"{ms(p.get('d2h_s'))} | {ms(p.get('host_s'))} | {ms(p.get('h2d_s'))} | "
                f"{ms(s)} | {sum_ratio} |")
    lines += ["", f"Targets met: {'yes' if verdict['all_met'] else 'NO'}"
              f"{' (dry run: correctness only, times not judged)' if args.fake else ''} "
              f"(0 crashes and 0 wrong "
              f"results; Gloo/staged >= {GLOO_TARGET} at every size; staged/separate sum <= "
              f"{OVERLAP_TARGET} at 1e8)", ""]
    return "\n".join(lines)


# =========================================================================================
# the workers (one per rank, under mpiexec)
# =========================================================================================

class Lib:
    """One library's device arrays: made from numpy, read back to numpy."""

    def __init__(self, name):
        self.name = name
        if name == "torch":
            import torch
            self.m = torch
        elif name == "cupy":
            import cupy
            self.m = cupy
        elif name == "numba":
            from numba import cuda
            self.m = cuda
        else:
            from pycollective.device import fake
            self.m = fake

    def dtypes(self):
        base = ["float16", "float64", "int32"]
        return base + (["bfloat16"] if self.name == "torch" else [])

    def make(self, a):
        import numpy as np
        if self.name == "torch":
            if a.dtype.name == "bfloat16":
                return self.m.from_numpy(a.astype(np.float32)).to("cuda").to(self.m.bfloat16)
            return self.m.from_numpy(np.ascontiguousarray(a)).to("cuda")
        if self.name == "cupy":
            return self.m.asarray(a)
        if self.name == "numba":
            return self.m.to_device(a)
        return self.m.fake_array(a, via="cai" if self.name == "fake-cai" else "dlpack")

    def read(self, x):
        import numpy as np
        if self.name == "torch":
            self.m.cuda.synchronize()
            if x.dtype == self.m.bfloat16:
                return x.float().cpu().numpy()
            return x.cpu().numpy()
        if self.name == "cupy":
            self.m.cuda.Device().synchronize()
            return self.m.asnumpy(x)
        if self.name == "numba":
            self.m.synchronize()
            return x.copy_to_host()
        return np.asarray(x.read())

    def sync(self):
        if self.name == "torch":
            self.m.cuda.synchronize()
        elif self.name == "cupy":
            self.m.cuda.Device().synchronize()
        elif self.name == "numba":
            self.m.synchronize()


def _libs(fake, checks):
    if fake:
        return [Lib("fake-dlpack"), Lib("fake-cai")]
    found = []
    for name in ("torch", "cupy", "numba"):
        try:
            lib = Lib(name)
            lib.make(__import__("numpy").zeros(1, "float32"))
            found.append(lib)
        except Exception as exc:  # noqa: BLE001  (the machine lacks it: said, not a failure)
            checks.notes.append(f"{name} device arrays not checked: {type(exc).__name__}: {exc}")
            print(f"[rank] {checks.notes[-1]}", flush=True)
    return found


def values(rank, count, dtype="float32", n=1):
    """Integer-valued data, exact in every reduction order (|sum| <= 4 * 64)."""
    import numpy as np
    from pycollective.data.kernels import BFLOAT16
    i = np.arange(count, dtype=np.int32)  # int32 steps: 1e8 elements in a fraction of a second
    i %= 97
    i *= 7
    i += rank * 13
    i %= 97
    v = i - 48
    if dtype == "bfloat16":
        return v.astype(np.float32).astype(BFLOAT16)
    if dtype.startswith("uint"):
        v = v + 48
    return v.astype(dtype)


class Checks:
    def __init__(self, comm):
        self.comm, self.items, self.notes = comm, [], []

    def add(self, name, ok, detail=""):
        # Every rank's verdict: a check fails if it failed anywhere.
        from mpi4py import MPI
        ok_all = self.comm.allreduce(bool(ok), op=MPI.LAND)
        if self.comm.Get_rank() == 0:
            self.items.append({"name": name, "ok": bool(ok_all), "detail": "" if ok_all
                               else (detail or "differs on some rank")})
            if not ok_all:
                print(f"  FAILED {name}: {detail}", flush=True)

    def run(self, name, fn):
        """``fn()`` returns (ok, detail); an exception is a failure of this check."""
        try:
            ok, detail = fn()
        except Exception as exc:  # noqa: BLE001  (reported per check)
            ok, detail = False, f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        self.add(name, ok, detail)


def _equal(got, want):
    import numpy as np
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False, f"shape {got.shape} != {want.shape}"
    if got.dtype != want.dtype:
        got, want = got.astype(np.float64), want.astype(np.float64)
    bad = np.flatnonzero(got != want)
    if bad.size:
        k = bad[0]
        return False, f"{bad.size} wrong, first at {k}: {got[k]} != {want[k]}"
    return True, ""


def worker_matrix(comm, fake, checks):
    import numpy as np
    from mpi4py import MPI
    import pycollective
    n, r = comm.Get_size(), comm.Get_rank()
    drop = pycollective.Comm(comm)
    counts = [0, 1, 1001, 1_000_003] + ([] if fake else [17_000_001])
    if fake:
        counts.append(300_007)

    def expected(count, dtype="float32", op="sum"):
        arrays = [values(q, count, dtype) for q in range(n)]
        acc = np.array(arrays, dtype=np.float64)
        res = {"sum": acc.sum(0), "max": acc.max(0)}[op]
        return res.astype(np.float32 if dtype == "bfloat16" else dtype)

    for lib in _libs(fake, checks):
        L = lib.name
        if r == 0:
            print(f"[matrix {n}] {L}", flush=True)
        for count in counts:
            mine = values(r, count)
            want = expected(count)

            def in_place():
                x = lib.make(mine)
                pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
                return _equal(lib.read(x), want)
            checks.run(f"{L} allreduce in place sum count={count}", in_place)

            def dev_to_dev():
                x, y = lib.make(mine), lib.make(np.zeros_like(mine))
                pycollective.allreduce(x, y, MPI.MAX, comm=comm)
                ok, d = _equal(lib.read(y), expected(count, op="max"))
                ok2, d2 = _equal(lib.read(x), mine)
                return ok and ok2, d or ("sendbuf modified: " + d2 if not ok2 else "")
            if count <= 1_000_003:
                checks.run(f"{L} allreduce device->device max count={count}", dev_to_dev)
        count = 1001
        mine, want = values(r, count), expected(count)

        def mixes():
            x, h = lib.make(mine), np.zeros_like(mine)
            pycollective.allreduce(x, h, comm=comm)
            ok1, d1 = _equal(h, want)
            y = lib.make(np.zeros_like(mine))
            pycollective.allreduce(mine.copy(), y, comm=comm)
            ok2, d2 = _equal(lib.read(y), want)
            return ok1 and ok2, d1 + d2
        checks.run(f"{L} allreduce device->host and host->device", mixes)
        for dtype in lib.dtypes():
            def typed(dtype=dtype):
                x = lib.make(values(r, count, dtype))
                pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
                return _equal(lib.read(x), expected(count, dtype))
            checks.run(f"{L} allreduce {dtype}", typed)

        def dropin():
            failures = []
            x, y = lib.make(mine), lib.make(np.zeros_like(mine))
            drop.Allreduce(x, y, MPI.SUM)
            ok, d = _equal(lib.read(y), want)
            failures += [] if ok else [f"Allreduce: {d}"]
            z = lib.make(mine)
            drop.Iallreduce(MPI.IN_PLACE, z, MPI.SUM).Wait()
            ok, d = _equal(lib.read(z), want)
            failures += [] if ok else [f"Iallreduce: {d}"]
            b = lib.make(mine if r == 0 else np.zeros_like(mine))
            drop.Bcast(b, root=0)
            ok, d = _equal(lib.read(b), values(0, count))
            failures += [] if ok else [f"Bcast: {d}"]
            g = lib.make(np.zeros(n * count, np.float32))
            drop.Allgather(lib.make(mine), g)
            ok, d = _equal(lib.read(g), np.concatenate([values(q, count) for q in range(n)]))
            failures += [] if ok else [f"Allgather: {d}"]
            big = values(r, 3 * n)
            rs = lib.make(np.zeros(3, np.float32))
            drop.Reduce_scatter_block(lib.make(big), rs, MPI.SUM)
            whole = np.sum([values(q, 3 * n) for q in range(n)], axis=0, dtype=np.float64)
            ok, d = _equal(lib.read(rs), whole[3 * r:3 * r + 3].astype(np.float32))
            failures += [] if ok else [f"Reduce_scatter_block: {d}"]
            return not failures, "; ".join(failures)
        checks.run(f"{L} drop-in Allreduce Iallreduce Bcast Allgather Reduce_scatter_block",
                   dropin)
        if L in ("torch", "cupy", "numba"):
            checks.run(f"{L} non-default stream", lambda lib=lib: _stream_case(lib, comm, n, r))


def _stream_case(lib, comm, n, r):
    """Made and doubled on a side stream; the call made on that stream; read on it."""
    import numpy as np
    from mpi4py import MPI
    import pycollective
    count = 4_000_037  # 16 MB: several chunks, the doubling kernel takes a while
    mine = values(r, count)
    want = (2 * np.sum([values(q, count) for q in range(n)], axis=0, dtype=np.float64)
            ).astype(np.float32)
    if lib.name == "torch":
        torch = lib.m
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.from_numpy(mine).to("cuda", non_blocking=False)
            for _ in range(20):  # keep the stream busy so a missing wait shows
                x.mul_(2).div_(2)
            x.mul_(2)
            pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
            y = x.clone()
        s.synchronize()
        return _equal(y.cpu().numpy(), want)
    if lib.name == "cupy":
        cp = lib.m
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            x = cp.asarray(mine)
            for _ in range(20):
                x *= 2
                x /= 2
            x *= 2
            pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
            y = x.copy()
        s.synchronize()
        return _equal(cp.asnumpy(y), want)
    cuda = lib.m
    s = cuda.stream()
    x = cuda.to_device(2 * mine, stream=s)
    pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
    got = x.copy_to_host(stream=s)
    s.synchronize()
    return _equal(got, want)


def worker_ddp(comm, fake, checks):
    import numpy as np
    from mpi4py import MPI
    import torch
    import pycollective
    import pycollective.torch as pt
    n, r = comm.Get_size(), comm.Get_rank()
    pt.init_process_group(comm)
    def bf16(state, bucket):
        # DDP refuses a hook *named* bf16_compress_hook unless NCCL is there (its own
        # check, by name): the same hook under another name.
        return pt.bf16_compress_hook(state, bucket)
    hooks = {"fp32": (pt.allreduce_hook, 1e-6), "fp16": (pt.fp16_compress_hook, 5e-3),
             "bf16": (bf16, 3e-2)}
    for label, (hook, rtol) in hooks.items():
        def case(hook=hook, rtol=rtol):
            torch.manual_seed(1 + r)  # different on every rank: broadcast_parameters fixes it
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 8)).cuda()
            pycollective.broadcast_parameters([p.data for p in model.parameters()], comm=comm)
            ref = [p.detach().clone() for p in model.parameters()]
            ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
            ddp.register_comm_hook(pt.HookState(comm), hook)
            g = torch.Generator(device="cpu").manual_seed(100 + r)
            xb = torch.randn(32, 64, generator=g).cuda()
            yb = torch.randn(32, 8, generator=g).cuda()
            loss = torch.nn.functional.mse_loss(ddp(xb), yb)
            loss.backward()
            grads = [p.grad.detach().cpu().numpy().astype(np.float64) for p in model.parameters()]
            # the reference: each rank's own gradient of the same model, averaged over ranks
            plain = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 8)).cuda()
            with torch.no_grad():
                for p, q in zip(plain.parameters(), ref):
                    p.copy_(q)
            torch.nn.functional.mse_loss(plain(xb), yb).backward()
            worst = 0.0
            for got, p in zip(grads, plain.parameters()):
                mine = p.grad.detach().cpu().numpy().astype(np.float64)
                mean = np.empty_like(mine)
                comm.Allreduce(mine, mean)
                mean /= n
                scale = np.abs(mean).max() + 1e-30
                worst = max(worst, float(np.abs(got - mean).max() / scale))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.step()
            torch.cuda.synchronize()
            pycollective.check_replicas([p.data for p in model.parameters()], comm=comm)
            return worst <= rtol, f"largest gradient error {worst:.2e} of the largest (<= {rtol})"
        checks.run(f"DDP on CUDA with {label} hook", case)


def _timed(comm, fn, reps, sync):
    """Median over ``reps`` of the slowest rank's time of ``fn()`` (device synchronized)."""
    import numpy as np
    from mpi4py import MPI
    times = []
    for _ in range(reps):
        sync()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(times))


def worker_perf(comm, fake, checks, perf):
    import numpy as np
    from mpi4py import MPI
    import pycollective
    n, r = comm.Get_size(), comm.Get_rank()
    plan = [(10**5, 5), (10**6, 3)] if fake else [(10**6, 15), (10**7, 7), (10**8, 3)]
    if fake:
        lib = Lib("fake-dlpack")
        dist = None
    else:
        import torch
        import torch.distributed as dist
        lib = Lib("torch")
        path = None
        if r == 0:
            path = tempfile.mktemp(prefix="gloo-", dir=os.environ.get("TMPDIR", "/tmp"))
        path = comm.bcast(path, root=0)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: loopback, as torch.py does
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=r, world_size=n)
    sync = lib.sync
    for count, reps in plan:
        if r == 0:
            print(f"[perf {n}] count {count:.0e}", flush=True)
        base = values(r, count)
        want = np.zeros(count, np.float32)  # exact: integers below 2^24
        for q in range(n):
            want += values(q, count)
        x = lib.make(base)
        row = {"count": count}

        def staged():
            pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
        staged()  # compiles, fills the pool; checked:
        checks.add(f"perf {count:.0e} staged result", *_equal(lib.read(x), want))
        row["staged_s"] = _timed(comm, staged, reps, sync)
        if dist is not None:
            y = lib.make(base)
            dist.all_reduce(y)
            checks.add(f"perf {count:.0e} gloo result", *_equal(lib.read(y), want))
            row["gloo_s"] = _timed(comm, lambda: dist.all_reduce(y), reps, sync)
            del y
        if count == plan[-1][0]:
            # The parts, timed one by one: one D2H copy, the host allreduce, one H2D copy.
            if dist is not None:
                import torch
                host_t = torch.empty(count, dtype=torch.float32, pin_memory=True)
                host = host_t.numpy()
                row["d2h_s"] = _timed(comm, lambda: host_t.copy_(x, non_blocking=True),
                                      reps, sync)
                pycollective.allreduce(MPI.IN_PLACE, host, comm=comm)
                row["host_s"] = _timed(
                    comm, lambda: pycollective.allreduce(MPI.IN_PLACE, host, comm=comm),
                    reps, sync)
                row["h2d_s"] = _timed(comm, lambda: x.copy_(host_t, non_blocking=True),
                                      reps, sync)
            else:
                host = np.empty(count, np.float32)
                row["d2h_s"] = _timed(comm, lambda: np.copyto(host, x._data), reps, sync)
                row["host_s"] = _timed(
                    comm, lambda: pycollective.allreduce(MPI.IN_PLACE, host, comm=comm),
                    reps, sync)
                row["h2d_s"] = _timed(comm, lambda: np.copyto(x._data, host), reps, sync)
            row["separate_s"] = row["d2h_s"] + row["host_s"] + row["h2d_s"]
        perf.append(row)
        if r == 0:
            print(f"[perf {n}]   {json.dumps(row)}", flush=True)
        del x
    if dist is not None:
        dist.destroy_process_group()


def work(args):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    checks, perf = Checks(comm), []
    env = {}
    if comm.Get_rank() == 0:
        import numpy
        env = {"python": sys.version.split()[0], "numpy": numpy.__version__,
               "MPI": MPI.Get_library_version().splitlines()[0].strip()}
        for name in ("torch", "cupy", "numba"):
            try:
                env[name] = __import__(name).__version__
            except Exception:  # noqa: BLE001
                env[name] = "absent"
    status = 0
    try:
        if args.worker == "matrix":
            worker_matrix(comm, args.fake, checks)
        elif args.worker == "ddp":
            worker_ddp(comm, args.fake, checks)
        elif args.worker == "perf":
            worker_perf(comm, args.fake, checks, perf)
    except Exception as exc:  # noqa: BLE001  (written to the JSON, then the job ends)
        traceback.print_exc()
        checks.items.append({"name": f"{args.worker} aborted", "ok": False,
                             "detail": f"{type(exc).__name__}: {exc}"})
        status = 1
    if comm.Get_rank() == 0:
        Path(args.json).write_text(json.dumps({"checks": checks.items, "perf": perf,
                                               "env": env, "notes": checks.notes}))
    if status:
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)  # a rank stuck in a collective must not hold the launch to its timeout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="directory for summary.md, results.json and the logs")
    parser.add_argument("--fake", action="store_true", help="the fake device (a dry run on CPUs)")
    parser.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    parser.add_argument("--only", help="comma-separated phases (matrix, ddp, perf)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("CHECK_BUDGET_S",
                                                                             "230")),
                        help="seconds for all phases (default 230); a phase that would not "
                             "fit is reported as not run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work(args)
        return 0
    if not args.out:
        parser.error("--out OUTDIR is required")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
