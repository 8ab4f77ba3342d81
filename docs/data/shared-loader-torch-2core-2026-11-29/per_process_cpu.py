# CPU-seconds of each process of one Sluice run of benches/shared_loader.py (N=2 by default; N=4, KIND=plain).
# Run from the repository root with a Python that has torch and the wheel.
import os, sys, subprocess, time
sys.argv=["x"]; sys.path.insert(0, "benches")
import shared_loader as sl
env = dict(os.environ, PYTHONUNBUFFERED="1", SLUICE_NAMESPACE=f"prof{os.getpid()}")
py = sys.executable
n = int(os.environ.get("N", "2")); kind = os.environ.get("KIND", "torch")
cmds = [[py, "-c", sl.TRAINER, "t", kind] for _ in range(n)] + [[py, "-c", sl.PUBLISHER, "3000", kind, "t", str(n)]]
procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for c in cmds]
for p in procs:
    _, status, ru = os.wait4(p.pid, 0)
    print("trainer" if p is not procs[-1] else "publisher", round(ru.ru_utime + ru.ru_stime, 1), "s", p.stdout.read().decode().strip()[-40:])
u = os.times(); print("all children", round(u.children_user + u.children_system, 1))
