"""What the RPC benchmark reads about a server's processes from /proc (Linux): the process
tree it runs as (one process, or a supervisor and its workers), their CPU time and
proportional set size, the state directory the workers share and the libraries they
loaded; and the pinning of this process's own threads to CPUs."""

from __future__ import annotations

import collections
import contextlib
import os
import re

TICKS = os.sysconf("SC_CLK_TCK")
# a server's shared state directory: tensorops-<random> in /dev/shm or the temporary directory
STATE_DIR = re.compile(r"^(/\S*/tensorops-[^/\s]+)/")


def _stat_fields(pid: int) -> list[str]:
    """Fields 3.. of /proc/<pid>/stat (the name, field 2, may hold spaces and parentheses)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads); NaN once it is gone."""
    try:
        after_name = _stat_fields(pid)
    except OSError:
        return float("nan")
    return (int(after_name[11]) + int(after_name[12])) / TICKS  # fields 14 and 15


def process_tree(root: int) -> list[int]:
    """`root` and every process descending from it, root first."""
    children = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children[int(_stat_fields(int(entry))[1])].append(int(entry))  # field 4: the parent
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children[pid])
    return tree


def tree_cpu_seconds(root: int) -> float:
    """CPU time of `root` and its descendants: a supervisor's with all its workers'. A
    descendant that ended meanwhile counts 0 (its time is lost); root's end gives NaN."""
    tree = process_tree(root)
    return cpu_seconds(root) + sum(t for t in map(cpu_seconds, tree[1:]) if t == t)


def tree_context_switches(root: int) -> int:
    """Context switches (voluntary and forced) of every thread of `root` and its descendants
    so far; threads that ended meanwhile are not counted."""
    total = 0
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/status") as f:
                    # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
                    total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    return total


def pss_bytes(pid: int) -> int:
    """Proportional set size: private pages plus each shared page divided by its sharers."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def mapped_paths(pid: int) -> set[str]:
    """Files a process has open or mapped."""
    paths = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                paths.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5].strip())
    return paths


def state_dirs(pids) -> set[str]:
    """The shared state directories (tensorops-*) that these processes hold files of."""
    return {m.group(1) for pid in pids for path in mapped_paths(pid) if (m := STATE_DIR.match(path))}


def dir_bytes(path: str) -> int:
    """Bytes the files under `path` occupy (allocated blocks: a sparse file counts what it holds)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
    return total


@contextlib.contextmanager
def pinned_threads(cpus: set[int] | None):
    """Run this process (every thread it has now, and so the threads they start) on
    `cpus` only, then give each thread back the CPUs it had (threads started meanwhile:
    the process's); None: no change."""
    if cpus is None:
        yield
        return
    process_cpus = os.sched_getaffinity(0)
    before = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid in map(int, os.listdir("/proc/self/task")):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before.get(tid, process_cpus))
