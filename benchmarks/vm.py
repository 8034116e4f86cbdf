"""The ``vm`` substrate's figures: boot and fork to first command, command latency against the same
root filesystem on the host, memory per idle VM.

    .venv/bin/python benchmarks/vm.py [--boots 2] [--forks 10] [--reps 5] [--idle 4] [--json FILE]

- boot to first command: a fresh VM (new overlay on the base disk, no snapshot) from process
  start to the answer of its first ``true``;
- fork to first command: ``create()`` (a fork of the booted snapshot, clock and entropy set) and
  its first ``true``; also the QEMU process's CPU seconds for it, which do not depend on the
  host's load;
- command latency: each command timed *inside* the guest by a small Python timer (no agent in the
  loop), and the same timer run on the host chrooted into the same Debian rootfs (a private mount
  namespace puts a tmpfs on its /tmp, the cached rootfs is never written); plus the round trip of
  ``exec("true")`` through the agent;
- memory per idle VM: ``--idle`` forks left idle, per QEMU process RSS, PSS (shared RAM-file pages
  split between the forks that map them) and private memory, and the drop of MemAvailable.

Every figure is printed with the machine's load average: on a shared host the wall-clock figures
grow with the load, the CPU figures do not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from drumsbench import images
from drumsbench.core.machine import commit, machine_info
from drumsbench.substrates.exec_core import SANDBOX_PATH
from drumsbench.substrates.vm.qemu import qemu_version
from drumsbench.substrates.vm.sandbox import VmSubstrate, run_folder
from drumsbench.substrates.vm.snapshot import boot

TIMER = r'''
import json, os, statistics, subprocess, sys, tempfile, time
reps = int(sys.argv[1])
work = tempfile.mkdtemp(dir=sys.argv[2])
os.chdir(work)
with open("t.py", "w") as f:
    f.write("def add(a, b):\n    return a + b\n\n")
    for i in range(18):
        f.write(f"assert add({i}, {i}) == {2 * i}\n")
cmds = {
    "true": "true",
    "sh: find | sort | head": "find / -maxdepth 2 -type d 2>/dev/null | sort | head -50 > /dev/null",
    "python3 -c pass": "python3 -c pass",
    "python3 20-line assert file": "python3 t.py",
    "python3 import unittest": "python3 -c 'import unittest'",
    "git init + add + commit": "rm -rf r && git init -q r && cd r && echo x > f && git add f && "
                               "git -c user.email=a@b -c user.name=n commit -qm m",
}
out = {}
env = dict(os.environ, HOME=work, PYTHONDONTWRITEBYTECODE="1")
for name, cmd in cmds.items():
    subprocess.run(["/bin/sh", "-c", cmd], env=env, check=True)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", cmd], env=env, check=True)
        times.append(time.perf_counter() - t0)
    out[name] = statistics.median(times)
print(json.dumps(out))
'''


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mem_kib(pid: int) -> dict[str, int]:
    got: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            got[key] = int(rest.split()[0])
    return got


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


def ms(x: float) -> str:
    return f"{x * 1000:8.0f} ms"


def summary(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"median {ms(statistics.median(xs))}  p95 {ms(p95)}  min {ms(xs[0])}  (n={len(xs)})"


def host_timer(reps: int) -> tuple[dict[str, float], str]:
    """The timer on the host, chrooted into the cached rootfs with a private tmpfs on its /tmp."""
    root = images.ensure_rootfs()
    tmp: str | None = None
    if os.geteuid() == 0 and shutil.which("unshare"):
        script = f'mount -t tmpfs none "$1/tmp" && exec chroot "$1" /usr/bin/python3 -c "$2" {reps} /tmp'
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(root), TIMER]
        where = f"host, chroot into {root}"
    else:
        tmp = tempfile.mkdtemp()
        argv = ["python3", "-c", TIMER, str(reps), tmp]
        where = "host binaries (not root: no chroot into the rootfs)"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={"PATH": SANDBOX_PATH})
    finally:
        if tmp is not None:  # nothing of the benchmark stays in /tmp
            shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"host timer failed: {proc.stderr[-500:]}")
    return json.loads(proc.stdout), where


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boots", type=int, default=2, help="fresh boots to time (each takes several seconds)")
    ap.add_argument("--forks", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5, help="repetitions per command for the latency table")
    ap.add_argument("--idle", type=int, default=4, help="idle VMs for the memory figure")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    state = Path(tempfile.mkdtemp(prefix="drumsbench-vm-bench-"))
    run_id = "bench" + uuid.uuid4().hex[:8]
    sub = VmSubstrate(run_id, state)
    results: dict[str, object] = {"machine": machine_info(), "commit": commit(), "load_start": load()}
    try:
        snap = sub.booted()
        print(f"machine: {results['machine']}  commit {results['commit']}")
        print(f"{qemu_version()}; guest kernel {snap.image.kernel_version}; accel {snap.accel}: {snap.accel_why}")
        print(f"load average at start: {results['load_start']}")
        results.update(accel=snap.accel, accel_why=snap.accel_why, qemu=qemu_version(),
                       kernel=snap.image.kernel_version, snapshot_boot_s=snap.boot_s)

        # -- boot to first command --------------------------------------------------------------
        boots = []
        for i in range(args.boots):
            folder = run_folder(state, run_id) / f"boot{i}"
            folder.mkdir(parents=True)
            disk = folder / "disk.qcow2"
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(snap.image.disk), "-F", "qcow2",
                            str(disk)], check=True)
            t0 = time.monotonic()
            vm = boot(snap.image, snap.accel, folder, run_id, f"boot{i}", ram=folder / "ram", share=False, disk=disk)
            vm.agent.call("exec", 60, argv=["true"], cwd="/", env={"PATH": SANDBOX_PATH}, timeout=30, limit=1024)
            boots.append(time.monotonic() - t0)
            vm.kill()
            shutil.rmtree(folder)
        print(f"\nboot to first command ({snap.accel}): {summary(boots) if boots else 'skipped'}"
              f"   [the cached snapshot's own boot: {snap.boot_s:.1f} s]")
        results["boot_to_first_command_s"] = boots

        # -- fork to first command --------------------------------------------------------------
        create, first, cpu, teardown = [], [], [], []
        for _ in range(args.forks):
            t0 = time.monotonic()
            box = sub.create()
            t1 = time.monotonic()
            res = box.exec("true", timeout=60)
            t2 = time.monotonic()
            assert res.exit_code == 0
            cpu.append(cpu_s(box.vm.proc.pid))
            box.destroy()
            teardown.append(time.monotonic() - t2)
            create.append(t1 - t0)
            first.append(t2 - t0)
        print(f"\nfork to first command:   {summary(first)}   (target <= 500 ms)")
        print(f"  create (fork ready):   {summary(create)}")
        print(f"  QEMU CPU for both:     {summary(cpu)}")
        print(f"  destroy:               {summary(teardown)}")
        results.update(fork_to_first_command_s=first, fork_create_s=create, fork_cpu_s=cpu, destroy_s=teardown)

        # -- command latency, guest vs host ----------------------------------------------------
        box = sub.create()
        try:
            rt = []
            box.exec("true", timeout=60)
            for _ in range(max(5, args.reps)):
                t0 = time.monotonic()
                box.exec("true", timeout=60)
                rt.append(time.monotonic() - t0)
            res = box.exec(["python3", "-c", TIMER, str(args.reps), box.paths.tmp], timeout=1200)
            if res.exit_code != 0:
                raise SystemExit(f"guest timer failed: {res.stderr.decode()[-500:]}")
            guest = json.loads(res.stdout)
        finally:
            box.destroy()
        host, where = host_timer(args.reps)
        print(f"\ncommand latency, median of {args.reps} (guest timed inside the guest; {where})")
        print(f"  {'command':32s} {'guest':>11s} {'host':>11s}  ratio")
        for name, g in guest.items():
            h = host[name]
            print(f"  {name:32s} {ms(g)} {ms(h)}  {g / h:5.1f}x")
        print(f"  exec('true') round trip through the agent: {summary(rt)}")
        results.update(latency_guest_s=guest, latency_host_s=host, latency_host_where=where, exec_true_rt_s=rt)

        # -- memory per idle VM -------------------------------------------------------------------
        before = mem_available_kib()
        idle = [sub.create() for _ in range(args.idle)]
        try:
            for b in idle:
                b.exec("true", timeout=60)
            time.sleep(1.0)
            mems = [mem_kib(b.vm.proc.pid) for b in idle]
            drop = (before - mem_available_kib()) / 1024 / args.idle
        finally:
            for b in idle:
                b.destroy()
        rss = statistics.median(m["Rss"] for m in mems) / 1024
        pss = statistics.median(m["Pss"] for m in mems) / 1024
        own = statistics.median(m["Private_Clean"] + m["Private_Dirty"] for m in mems) / 1024
        print(f"\nmemory per idle VM ({args.idle} idle forks, guest RAM {snap.ram.stat().st_size >> 20} MiB):"
              f" RSS {rss:.0f} MiB, PSS {pss:.0f} MiB, private {own:.0f} MiB; MemAvailable drop {drop:.0f} MiB/VM")
        results.update(idle_rss_mib=rss, idle_pss_mib=pss, idle_private_mib=own, idle_memavailable_drop_mib=drop)
    finally:
        sub.close()
        left = sub.leftovers()
        results["leftovers"] = left
        results["load_end"] = load()
        print(f"\nload average at end: {results['load_end']}; left behind: {left or 'nothing'}")
        shutil.rmtree(state, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
