"""The hostile campaign against a server build: every attack of
tests/e2e/hostile.py (rows 1 to 10) on a fresh server process of its own, inside a cgroup v1
memory limit (3 GB by default), on the default configuration plus
what the row needs (shared memory for rows 6 and 8, two tokens for row 8, a soft limit of
1024 file descriptors for row 10). Prints a markdown table: the request, how the server
answered, the time to refuse, the server's peak resident memory, the slowest health check
during the attack, whether legitimate calls succeed afterwards and whether the server is
still alive.

    sudo .venv/bin/python bench/hostile.py                          # this checkout's server
    sudo .venv/bin/python bench/hostile.py --server /path/to/venv/bin/tensorops-server
    sudo .venv/bin/python bench/hostile.py --rows 1,2 --scale ci    # smaller sizes
    .venv/bin/python bench/hostile.py --compare before.jsonl after.jsonl   # two runs side by side

The full sizes kill an unprotected server, so the memory cgroup is required at that scale
(root, cgroup v1 memory controller at /sys/fs/cgroup/memory); each cgroup is removed after
its row. Loopback only; every row is bounded in time (--row-timeout kills a server that
outlives it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

import hostile
from rpc_server import ServerProcess

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


class MemoryCgroup:
    """A cgroup v1 memory cgroup with a limit, removed on close (its processes gone)."""

    def __init__(self, name: str, limit: int):
        self.path = CGROUP_ROOT / name
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def join(self) -> None:
        """Move the calling process in (a preexec_fn: the server starts inside)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except OSError:  # its last process is still exiting
                time.sleep(0.05)
        raise RuntimeError(f"cannot remove {self.path}")


def size_text(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / (1 << 20):,.0f} MiB"


def seconds_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def died_how(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit {returncode}"
    return signal.Signals(-returncode).name


def run_row(
    row: int, server: list[str] | None, scale: str, limit: int | None, row_timeout: float, log_dir: Path
) -> hostile.Outcome:
    cgroup = MemoryCgroup(f"tensorops-hostile-{os.getpid()}-{row}", limit) if limit else None
    fd_limit = hostile.ROW_FD_LIMIT.get(row)

    def prepare():
        if cgroup is not None:
            cgroup.join()
        if fd_limit is not None:
            hostile.limit_fds(fd_limit)()

    proc = ServerProcess(log_dir / f"row{row}.log", *hostile.ROW_FLAGS.get(row, ()), command=server, preexec_fn=prepare)
    try:
        proc.start()
        watchdog = threading.Timer(row_timeout, proc.kill)  # a row that outlives its bound ends with its server
        watchdog.start()
        try:
            out = hostile.run(row, hostile.Target(proc.target, proc.proc.pid, proc.metrics_port), scale)
        finally:
            watchdog.cancel()
        if not out.alive:
            proc.proc.wait(10)
            how = died_how(proc.proc.returncode)
            if cgroup is not None and cgroup.oom_kills():
                how += ", OOM-killed in the cgroup"
            out.outcome = out.outcome.replace("server died", f"server died ({how})", 1)
        if cgroup is not None:
            out.details["cgroup_peak"] = cgroup.peak()
            if not out.alive:  # VmHWM was last sampled before the end; the cgroup saw it all
                out.peak_rss = max(out.peak_rss or 0, out.details["cgroup_peak"])
        return out
    finally:
        proc.kill()
        if cgroup is not None:
            cgroup.close()


def markdown(outcomes: list[hostile.Outcome], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| # | request | outcome | time to refuse | peak RSS | max health latency | legitimate calls after "
        "| server alive |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        cells = [
            str(o.row),
            o.request,
            o.outcome.replace("|", "/"),
            refusal_text(o),
            size_text(o.peak_rss),
            seconds_text(o.max_health_latency),
            {True: "ok", False: "fail", None: "-"}[o.legitimate_ok],
            "yes" if o.alive else "no",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def load_outcomes(path: str) -> dict[int, hostile.Outcome]:
    """The outcomes a run wrote next to its table (--out X.md writes X.jsonl)."""
    outcomes = {}
    for line in Path(path).read_text().splitlines():
        fields = json.loads(line)
        outcomes[fields["row"]] = hostile.Outcome(**fields)
    return outcomes


def refusal_text(o: hostile.Outcome) -> str:
    if "died_after" in o.details:
        return f"died after {seconds_text(o.details['died_after'])}"
    return seconds_text(o.refused_after) if o.refused_after is not None else "not refused"


def comparison(before_path: str, after_path: str) -> str:
    """Before and after of each row, side by side: time to refuse, peak resident memory,
    slowest health check."""
    before, after = load_outcomes(before_path), load_outcomes(after_path)
    lines = [
        "| # | time to refuse, before | after | peak RSS, before | after | max health latency, before | after "
        "| alive after, before | after |",
        "| --- " * 9 + "|",
    ]
    for row in sorted(set(before) | set(after)):
        b, a = before.get(row), after.get(row)

        def cells(o: hostile.Outcome | None) -> list[str]:
            if o is None:
                return ["-"] * 4
            return [
                refusal_text(o),
                size_text(o.peak_rss),
                seconds_text(o.max_health_latency),
                "yes" if o.alive else "no",
            ]

        cb, ca = cells(b), cells(a)
        lines.append("| " + " | ".join([str(row)] + [x for pair in zip(cb, ca, strict=True) for x in pair]) + " |")
    return "\n".join(lines) + "\n"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="the tensorops-server program (default: this checkout's)")
    parser.add_argument("--rows", default=",".join(map(str, hostile.ATTACKS)), help="comma-separated rows")
    parser.add_argument("--scale", choices=sorted(hostile.SCALES), default="full")
    parser.add_argument("--memory-limit", default="3G", help="the cgroup's limit (0: no cgroup, --scale ci only)")
    parser.add_argument("--row-timeout", type=float, default=150.0, help="seconds after which a row's server is killed")
    parser.add_argument("--title", default="hostile campaign")
    parser.add_argument("--out", help="also write the table (and the details as JSON lines next to it) here")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE.jsonl", "AFTER.jsonl"),
        help="print two runs side by side (from their --out files) and run nothing",
    )
    args = parser.parse_args()
    if args.compare:
        print(comparison(*args.compare))
        return
    limit = parse_size(args.memory_limit)
    if not limit and args.scale == "full":
        parser.error("the full scale runs only inside a memory cgroup (--memory-limit)")
    if limit and not CGROUP_ROOT.is_dir():
        parser.error(f"no cgroup v1 memory controller at {CGROUP_ROOT}")
    server = [args.server] if args.server else None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: each row still kills its server, drops its cgroup
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as log_dir:
        for row in (int(r) for r in args.rows.split(",")):
            started = time.monotonic()
            out = run_row(row, server, args.scale, limit, args.row_timeout, Path(log_dir))
            out.details["seconds"] = round(time.monotonic() - started, 1)
            print(f"row {row}: {out.outcome} ({out.details['seconds']} s)", file=sys.stderr, flush=True)
            outcomes.append(out)
    table = markdown(
        outcomes,
        f"{args.title} ({args.server or 'this checkout'}, scale {args.scale}, cgroup limit {args.memory_limit})",
    )
    print(table)
    if args.out:
        Path(args.out).write_text(table)
        with open(Path(args.out).with_suffix(".jsonl"), "w") as f:
            for o in outcomes:
                f.write(
                    json.dumps(
                        {
                            "row": o.row,
                            "request": o.request,
                            "outcome": o.outcome,
                            "refused_after": o.refused_after,
                            "peak_rss": o.peak_rss,
                            "max_health_latency": o.max_health_latency,
                            "legitimate_ok": o.legitimate_ok,
                            "alive": o.alive,
                            "details": o.details,
                        },
                        default=str,
                    )
                    + "\n"
                )


if __name__ == "__main__":
    main()
