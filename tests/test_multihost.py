"""Several hosts for real: MPICH cliques and network namespaces (scripts/multihost/emulate.sh).

Each launch runs tests/multihost/every_algorithm.py, which checks every
algorithm that can run across the hosts, and auto until it has decided, bit
for bit against the exact reduction with identical replicas, and then
finalizes MPI on the network module in use (a failing MPI_Finalize is a
failed launch).  Two ways of making hosts:

* MPICH cliques (``MPIR_CVAR_NUM_CLIQUES``): ranks of one machine split into
  "nodes", libfabric's TCP on loopback between them; needs no privilege.
* Network namespaces: one per host with its own hostname and /dev/shm,
  joined by veth through a bridge (or a TUN delay line), links shaped with
  tbf; needs root and namespaces, skipped with the reason where the machine
  does not allow them.

After every launch nothing may be left: no namespace of that run, no
process carrying its tag.  Launches are bounded (LIMIT) and few; the
quick ones check one (dtype, op) pair.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMULATE = ROOT / "scripts" / "multihost" / "emulate.sh"
CHECK = ROOT / "tests" / "multihost" / "every_algorithm.py"
RUN_MPI = ROOT / "scripts" / "run_mpi.sh"
LIMIT = 240  # seconds per launch (the job), with margin below for the tear-down
TAG = "PYCOLLECTIVE_TEST_TAG"  # in the environment of every process of one launch
SUMMARY = re.compile(r"multihost-check: (\d+) ranks, nodes \[([\d, ]+)\].* problems (\d+)")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the emulation needs Linux")


def _env(**extra):
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(LIMIT))
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _namespaces(pid):
    """The namespaces left by the emulate.sh run of process ``pid``."""
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"mh{pid}-")]


def _processes(tag, ranks_only=False):
    """Pids whose environment holds ``tag`` (``ranks_only``: the Python ranks)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            argv0 = argv[0]
        except OSError:
            continue
        rank = argv0 == sys.executable.encode() and b"mpi4py" in argv
        if f"{TAG}={tag}".encode() in environ and (rank or not ranks_only):
            found.append(int(pid))
    return found


def _launch(options, program_args, timeout=LIMIT + 30, env=None):
    """Run emulate.sh; return (exit status, output); assert that nothing is left behind."""
    tag = uuid.uuid4().hex[:12]
    cmd = [str(EMULATE), *options, "--", *program_args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(env or _env(), **{TAG: tag}),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd)} did not end within {timeout} s:\n{out[-5000:]}")
    assert not _namespaces(proc.pid), f"namespaces left: {_namespaces(proc.pid)}"
    assert not _processes(tag), f"processes left: {_processes(tag)}"
    return proc.returncode, out


def _mpich_with_ofi():
    mpiexec = Path(sys.executable).parent / "mpiexec"
    exe = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if exe is None:
        return "no mpiexec"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "HYDRA" not in version.upper():
        return "the installed MPI is not MPICH (cliques and the ssh stand-in need Hydra)"
    return None


@pytest.fixture(scope="module")
def netns():
    why = _mpich_with_ofi()
    if why:
        pytest.skip(why)
    proc = subprocess.run([str(EMULATE), "--check"], capture_output=True, text=True, timeout=60)
    if proc.returncode == 3:
        pytest.skip(proc.stderr.strip().replace("emulate.sh: ", ""))
    assert proc.returncode == 0, proc.stderr


def _every_algorithm(options, nodes, quick=False):
    args = [str(CHECK), ",".join(map(str, nodes))] + (["quick"] if quick else [])
    status, out = _launch(options, args)
    found = SUMMARY.search(out)
    assert status == 0 and found, f"exit status {status}:\n{out[-20000:]}"
    assert int(found.group(1)) == sum(nodes)
    assert sorted(int(x) for x in found.group(2).split(",")) == sorted(nodes)
    assert int(found.group(3)) == 0
    return out


def test_cliques_every_algorithm_on_2_hosts_of_2():
    why = _mpich_with_ofi()
    if why:
        pytest.skip(why)
    out = _every_algorithm(["--mode", "cliques", "-H", "2x2"], [2, 2])
    assert "unusable ['shm']" in out  # shm needs one node, and says so


def test_cliques_calibration_measures_links_inside_and_between_nodes(tmp_path):
    why = _mpich_with_ofi()
    if why:
        pytest.skip(why)
    path = tmp_path / "model.json"
    status, out = _launch(["--mode", "cliques", "-H", "2x2"], [
        "-m", "pycollective.model", "calibrate", "--output", str(path), "--quiet",
        "--max-bytes", "64K", "--factor", "16", "--reps", "2", "--counts", "1,100"])
    assert status == 0, out[-5000:]
    entry = json.loads(path.read_text())["by_nranks"]["4"]
    assert entry["nodes"] == 2 and entry["layout"] == [2, 2]
    assert entry["inter"]["alpha"] > 0 and len(entry["inter_exchange"]) == 4
    assert set(entry["corrections"]) == {"ring", "tree", "butterfly", "ps", "naive",
                                         "ring_pipelined", "rabenseifner", "hierarchical"}


def test_netns_every_algorithm_on_2_hosts_of_2(netns):
    out = _every_algorithm(["-H", "2x2"], [2, 2])
    assert "hosts ['node0', 'node1']" in out  # each host has its own name


@pytest.mark.parametrize("options, nodes", [
    (["-H", "3,3", "--cyclic", "--netmod", "ucx"], [3, 3]),   # ranks dealt over hosts, UCX
    (["-H", "3,2", "--rate", "1gbit"], [3, 2]),              # unequal hosts, a shaped link
])
def test_netns_unequal_placements(netns, options, nodes):
    _every_algorithm(options, nodes, quick=True)


def test_netns_delay_line(netns):
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the delay line (set CC)")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun: the delay line needs TUN devices")
    _every_algorithm(["-H", "2x1", "--delay", "25us", "--rate", "4gbit"], [1, 1], quick=True)


SLEEPER = ["-c", "import time; time.sleep(600)"]


def test_netns_tear_down_after_the_time_limit(netns):
    start = time.monotonic()
    status, out = _launch(["-H", "2x1"], SLEEPER, env=_env(PYCOLLECTIVE_TIMEOUT="3"))
    assert status == 124, out
    assert time.monotonic() - start < 30


def test_netns_tear_down_after_sigterm(netns):
    tag = uuid.uuid4().hex[:12]
    proc = subprocess.Popen([str(EMULATE), "-H", "2x1", "--", *SLEEPER],
                            env=_env(**{TAG: tag}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while len(_processes(tag, ranks_only=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out
    assert not _namespaces(proc.pid) and not _processes(tag)


def test_ofi_finalize_is_clean_after_shared_memory_algorithms():
    """One host, MPICH's OFI network module: shm and hierarchical hold shared windows."""
    why = _mpich_with_ofi()
    if why:
        pytest.skip(why)
    env = _env(MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE="lo",
               PYCOLLECTIVE_TIMEOUT="120")
    cmd = [str(RUN_MPI), "2", "-m", "pycollective.bench", "shm", "hierarchical", "auto",
           "--M", "300000", "--iters", "2", "--warmup", "1", "--quiet"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "fabricclose" not in proc.stderr


# --- a host lost mid-job, and a lossy link ------------------------------------------------

PARTITION = ROOT / "tests" / "multihost" / "partition.py"
CUT_TIMEOUT = 4   # PYCOLLECTIVE_TIMEOUT_S of the partition jobs
CUT_SLACK = 6     # seconds beyond it for every rank's error: a poll, the side channel, load
END_SLACK = 30    # and for the job's end: aborts, then emulate.sh's tear-down


def _results(folder):
    return {int(p.name.split(".")[1]): json.loads(p.read_text())
            for p in folder.glob("result.*") if not p.name.endswith(".tmp")}


def _cut_mid_job(tmp_path, options, algorithm, hosts, count=None):
    """Launch partition.py, cut the last host's link once calls run; (status, out, cut, end)."""
    tag = uuid.uuid4().hex[:12]
    env = _env(PYCOLLECTIVE_TIMEOUT="120", PYCOLLECTIVE_TIMEOUT_S=str(CUT_TIMEOUT), **{TAG: tag})
    proc = subprocess.Popen([str(EMULATE), *options, "--", str(PARTITION), str(tmp_path), "cut",
                             algorithm, *([str(count)] if count else [])], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)
                out, _ = proc.communicate(timeout=60)
                pytest.fail(f"the job did not start its calls:\n{out[-5000:]}")
            time.sleep(0.05)
        # The veth of the last host goes down: its packets vanish, no reset is sent
        # (what a pulled cable or a dead switch port does).
        subprocess.run(["ip", "-n", f"mh{proc.pid}-h{hosts - 1}", "link", "set", "eth0", "down"],
                       check=True)
        cut = time.monotonic()
        out, _ = proc.communicate(timeout=CUT_TIMEOUT + CUT_SLACK + END_SLACK + 30)
        end = time.monotonic()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the job did not end after the cut:\n{out[-5000:]}")
    assert not _namespaces(proc.pid), f"namespaces left: {_namespaces(proc.pid)}"
    assert not _processes(tag), f"processes left: {_processes(tag)}"
    return proc.returncode, out, cut, end


@pytest.mark.parametrize("options, algorithm, count", [
    (["-H", "2x2"], "ring", None),
    # 4 MiB: the cut lands in the agreement step or in the leaders' exchange
    (["-H", "2x2"], "hierarchical", 1 << 20),
    (["-H", "2x2", "--netmod", "ucx"], "hierarchical", None),
])
def test_netns_a_link_cut_mid_job_names_the_lost_ranks_everywhere(netns, tmp_path, options,
                                                                  algorithm, count):
    """Every rank raises within the timeout plus CUT_SLACK, naming the ranks beyond the cut
    and, where they are on another node, that node; the job ends; nothing is left (the
    hosts' /dev/shm are private mounts that go with them, namespaces and processes are
    checked, and Hydra's topology files in the /tmp the hosts share are gone: the job
    aborts, and emulate.sh's supervisor removes them)."""
    hydra = set(Path("/tmp").glob("hydra_hwloc_xmlfile_*"))
    status, out, cut, end = _cut_mid_job(tmp_path, options, algorithm, 2, count)
    left = set(Path("/tmp").glob("hydra_hwloc_xmlfile_*")) - hydra
    assert not left, f"the job left {sorted(map(str, left))}"
    results = _results(tmp_path)
    assert status != 0, out[-5000:]
    assert end - cut < CUT_TIMEOUT + CUT_SLACK + END_SLACK, (end - cut, out[-5000:])
    sides = {0: [2, 3], 1: [2, 3], 2: [0, 1], 3: [0, 1]}  # the ranks beyond the cut
    # Ranks 0 and 1 (mpiexec's host) must report; beyond the cut a rank may be killed
    # first (by the abort of its host's other rank).
    assert {0, 1} <= set(results), (results, out[-5000:])
    for rank, got in results.items():
        assert got["outcome"] in ("CollectiveTimeout", "PeerFailed"), got
        assert got["wrong"] == 0 and got["calls"] >= 20, got
        assert cut < got["at"] < cut + CUT_TIMEOUT + CUT_SLACK, (got["at"] - cut, got)
        lost = sides[rank]
        assert str(lost) in got["text"], got
        host = "node1" if rank < 2 else "node0"
        assert f"host '{host}'" in got["text"] and "stopped answering" in got["text"], got


def test_netns_a_lossy_link_slows_but_never_stalls(netns, tmp_path):
    """One packet in ten between the hosts dropped: TCP resends, calls are slower, none
    waits as long as the timeout (no error), every result is right."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler for the delay line (set CC)")
    if not os.path.exists("/dev/net/tun"):
        pytest.skip("no /dev/net/tun: the delay line needs TUN devices")
    status, out = _launch(["-H", "2x1", "--loss", "0.1"],
                          [str(PARTITION), str(tmp_path), "loss", "ring", "50"],
                          env=_env(PYCOLLECTIVE_TIMEOUT="200", PYCOLLECTIVE_TIMEOUT_S="10"))
    assert status == 0, out[-5000:]
    results = _results(tmp_path)
    assert set(results) == {0, 1}, out[-5000:]
    for got in results.values():
        assert got["outcome"] == "ok" and got["calls"] == 50 and got["wrong"] == 0, got
        assert got["slowest"] < 10, got
    assert "dropped at random" in out  # the delay line did drop packets
    print(f"lossy link: 50 calls in {max(r['seconds'] for r in results.values()):.1f} s, "
          f"slowest {max(r['slowest'] for r in results.values()):.2f} s")
