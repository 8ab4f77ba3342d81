#!/usr/bin/env python3
"""An hour of running (issue 50): does anything grow, fail or go missing?

    scripts/soak.py [--minutes 60] [--out FILE] [--sluice target/debug/sluice]

A producer runs pipelines/demo.sql (the demo dataset, generated here) epoch after epoch,
with four subscribers: two local ones that report every epoch (rows, checksum), one
churning (started, then SIGKILLed after 1 to 5 seconds, again and again), and one remote,
over `sluice serve --flight` on loopback. The steady subscribers pace the producer a
little (`--delay-ms`), so an hour is a few hundred epochs, not gigabytes of reports.

Every 10 s it samples, for the producer, the server and each steady subscriber, the
resident memory (VmRSS) and open descriptors, and the namespace's files in /dev/shm
(count, and bytes allocated). At the end it stops the producer (SIGINT) and checks that
every epoch each surviving subscriber reported is whole (every row, the source's
checksum) and that the epochs follow each other from the first. The result: growth of
each series over the run after its first ten minutes (the last minute's median against
the eleventh minute's), the verdicts, and every sample, as JSON in --out; the goal is
flat (within 5 %), no error, every surviving subscriber exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spawn(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(args, env=env, text=True, stdin=subprocess.DEVNULL, **kw)


def rss_and_fds(pid: int) -> tuple[int | None, int | None]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = next(int(l.split()[1]) * 1024 for l in status.splitlines() if l.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds
    except (OSError, StopIteration):
        return None, None


def shm_use(ns: str) -> tuple[int, int]:
    count = used = 0
    for base, prefix in (("/dev/shm", f"iox2_sluice_{ns}_"), ("/dev/shm", f"sluice-{ns}")):
        for entry in Path(base).iterdir():
            if not entry.name.startswith(prefix):
                continue
            paths = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
            for p in paths:
                try:
                    used += p.stat().st_blocks * 512
                    count += 1
                except OSError:
                    pass
    return count, used


def growth(samples: list[dict], key: str, start_s: float) -> float | None:
    """The last minute's median of `key` against the median of the minute after start_s,
    as a fraction (0.02: 2 % more)."""
    first = [s[key] for s in samples if start_s <= s["t"] < start_s + 60 and s.get(key) is not None]
    end = samples[-1]["t"] if samples else 0
    last = [s[key] for s in samples if s["t"] >= end - 60 and s.get(key) is not None]
    if not first or not last or statistics.median(first) == 0:
        return None
    return statistics.median(last) / statistics.median(first) - 1


def epochs_whole(lines: list[dict], rows: int, checksum: str) -> tuple[int, list[str]]:
    problems = []
    epochs = [l for l in lines if "epoch" in l and "rows" in l]
    for i, e in enumerate(epochs):
        if e["epoch"] != epochs[0]["epoch"] + i:
            problems.append(f"epoch {e['epoch']} follows {epochs[i - 1]['epoch']}")
        # The last epoch may have been cut by the stop.
        if i == len(epochs) - 1 and not e.get("complete", False):
            continue
        if e["rows"] != rows or e.get("checksum") != checksum or not e.get("complete"):
            problems.append(f"epoch {e['epoch']}: {e}")
    return len(epochs), problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sluice", default=str(ROOT / "target/debug/sluice"))
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--delay-ms", type=int, default=3)
    args = ap.parse_args()
    if args.minutes <= 0:
        ap.error("--minutes must be positive")
    work = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    ns = f"soak{os.getpid()}"
    env = dict(os.environ, SLUICE_NAMESPACE=ns, SLUICE_LOG="warn")
    sl = args.sluice
    # The demo's own layout (data/demo/, pipelines/demo.sql), in the work directory.
    plan = work / "pipelines" / "demo.sql"
    subprocess.run([sl, "demo", "--prepare-only", "--rows", str(args.rows)], env=env,
                   check=True, cwd=work, stdout=subprocess.DEVNULL)
    check = subprocess.run([sl, "checksum", str(plan)], env=env, check=True, cwd=work,
                           capture_output=True, text=True).stdout
    print(check.strip())
    rows = int(next(w for w in check.replace(",", " ").split() if w.isdigit()))
    checksum = check.split()[-1]
    topic = next(l.split("'")[1] for l in plan.read_text().splitlines()
                 if l.strip().lower().startswith("set sluice.topic"))

    logs = {name: open(work / f"{name}.log", "w") for name in ("producer", "server", "a", "b", "remote", "churn")}
    producer = spawn([sl, "run", str(plan), "--epochs", "1000000", "--min-subscribers", "3",
                      "--quiet", "--linger", "0"], env, cwd=work, stderr=logs["producer"],
                     stdout=logs["producer"])
    server = spawn([sl, "serve", "--flight", "127.0.0.1:0"], env, cwd=work,
                   stdout=subprocess.PIPE, stderr=logs["server"])
    addr = server.stdout.readline().split()[-1]
    # Reports go to files: a pipe read only at the end fills, and blocks its writer.
    reports = {name: work / f"{name}.jsonl" for name in ("a", "b", "remote")}
    steady = {
        name: spawn([sl, "subscribe", target, "--json", "--timeout", "120", "--delay-ms",
                     str(args.delay_ms)], env, cwd=work, stdout=open(reports[name], "w"),
                    stderr=logs[name])
        for name, target in (("a", topic), ("b", topic), ("remote", f"flight://{addr}/{topic}"))
    }
    pids = {"producer": producer.pid, "server": server.pid,
            **{name: p.pid for name, p in steady.items()}}
    print("pids:", json.dumps(pids), flush=True)
    started = time.monotonic()
    samples: list[dict] = []
    rng = random.Random(50)
    churned = 0
    churner: subprocess.Popen[str] | None = None
    churn_until = 0.0
    next_sample = 0.0
    try:
        while (elapsed := time.monotonic() - started) < args.minutes * 60:
            if churner is None:
                churner = spawn([sl, "subscribe", topic, "--timeout", "60"], env, cwd=work,
                                stdout=subprocess.DEVNULL, stderr=logs["churn"])
                churn_until = elapsed + rng.uniform(1, 5)
            elif elapsed >= churn_until:
                churner.kill()
                churner.wait()
                churner, churned = None, churned + 1
            if elapsed >= next_sample:
                sample: dict = {"t": round(elapsed, 1)}
                for name, proc in (("producer", producer), ("server", server), *steady.items()):
                    rss, fds = rss_and_fds(proc.pid)
                    sample[f"{name}_rss"], sample[f"{name}_fds"] = rss, fds
                sample["shm_files"], sample["shm_bytes"] = shm_use(ns)
                samples.append(sample)
                next_sample += 10
                dead = [n for n, p in (("producer", producer), ("server", server), *steady.items())
                        if p.poll() is not None]
                if dead:
                    print(f"ended early: {dead}", file=sys.stderr)
                    break
            time.sleep(0.2)
    finally:
        if churner is not None:
            churner.kill()
            churner.wait()
        producer.send_signal(signal.SIGINT)
        producer.wait(timeout=120)
        for p in steady.values():
            p.wait(timeout=180)
        outputs = {n: reports[n].read_text() for n in steady}
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    result: dict = {"minutes": args.minutes, "pids": pids, "rows_per_epoch": rows,
                    "checksum": checksum,
                    "churned_subscribers": churned, "subscribers": {}, "growth": {},
                    "producer_exit": producer.returncode}
    ok = True
    for name, out in outputs.items():
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        count, problems = epochs_whole(lines, rows, checksum)
        result["subscribers"][name] = {"epochs": count, "problems": problems[:5],
                                       "exit": steady[name].returncode}
        ok &= not problems and count > 0
    start = min(600.0, args.minutes * 60 / 6)
    for key in samples[0] if samples else []:
        if key != "t":
            result["growth"][key] = growth(samples, key, start)
    flat = all(g is None or g <= 0.05 for k, g in result["growth"].items())
    result["verdict"] = {"flat_within_5_percent": flat, "exactly_once": ok}
    result["samples"] = samples
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    subprocess.run([sl, "status"], env=env, cwd=work)
    # Every process of the namespace has exited: what it leaves (empty directories, the
    # node counter, the state directory) goes, as the tests' namespaces do.
    import shutil
    shutil.rmtree(f"/dev/shm/sluice-{ns}", ignore_errors=True)
    for leftover in Path("/dev/shm").glob(f"iox2_sluice_{ns}_*"):
        leftover.unlink(missing_ok=True)
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()):
        if base:
            shutil.rmtree(Path(base) / f"sluice-{ns}.state", ignore_errors=True)
    if flat and ok:
        shutil.rmtree(work, ignore_errors=True)
        return 0
    print(f"logs and reports kept in {work}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
