"""Leak accounting: the slope math, the sampler, and its positive control — a deliberate leak per
attempt (a kept file descriptor, a file left in a tmp folder) fails a window's leak check; a clean
sweep on the same substrate passes it."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from drumsbench.experiments import leak_sampler
from drumsbench.experiments.run import RunConfig
from drumsbench.experiments.sweep import SweepConfig, build, publish, run_sweep
from drumsbench.ledger import Ledger
from drumsbench.measure import artifacts
from drumsbench.measure.leaks import slope_interval
from drumsbench.report.sweep import render

# -- the math -----------------------------------------------------------------------------------------


def test_a_flat_noisy_series_has_an_interval_around_zero():
    rng = random.Random(1)
    t = [i / 3600 for i in range(200)]  # one sample a second
    y = [10 + rng.choice((-1, 0, 1)) for _ in t]
    _, lo, hi, n_eff = slope_interval(t, y)
    assert lo is not None and hi is not None and n_eff is not None
    assert lo < 0 < hi


def test_a_rising_series_is_clearly_above_zero_and_a_constant_is_exactly_zero():
    t = [i / 3600 for i in range(100)]
    covered = 0
    for seed in range(200):
        rng = random.Random(seed)
        y = [5 + 360 * x + rng.choice((-1, 0, 1)) for x in t]  # +360 per hour, one every 10 s
        _, lo, hi, _ = slope_interval(t, y)
        assert lo is not None and hi is not None and lo > 100
        covered += lo <= 360 <= hi
    assert 0.9 <= covered / 200 <= 0.99  # a 95% interval (independent noise here)
    assert slope_interval(t, [7.0] * len(t))[:3] == (0.0, 0.0, 0.0)


def test_autocorrelated_steps_widen_the_interval():
    t = [i / 3600 for i in range(60)]
    step = [0.0] * 30 + [1.0] * 30  # one change half way: a trend is not established
    _, lo, _, n_eff = slope_interval(t, step)
    assert n_eff is not None and n_eff < 10
    assert lo is None or lo < 5  # never above a tolerance of 5/h


# /tmp entries through the 20-s leaky soak of test_a_deliberate_leak... below, as sampled in a run that
# failed (one file per attempt, 2 slots, on a loaded machine): the rate wobbles, the residuals are
# autocorrelated to n_eff 2.1, and the slope gets no interval at all
LEAKY_TMP = [74, 78, 80, 84, 86, 88, 90, 90, 92, 92, 93, 95, 95, 96, 99, 102, 104, 106, 108, 110, 112, 114, 116,
             118, 122, 123, 126, 128, 130, 132, 132, 135, 136, 137, 137, 139, 139, 139, 141, 141, 141, 143, 145,
             146, 147, 149, 151, 151, 152, 154, 155, 157, 159, 161, 163, 165, 168, 171, 173, 176, 179, 179, 181,
             181, 181, 183]


def test_a_staircase_leaks_by_its_steps_and_a_sawtooth_does_not():
    """The recorded staircase only ever rose: it leaks by its steps, though its slope gets no interval.
    A sawtooth (fds opened one by one, closed in batches) rises far more often than it falls with no
    trend: it does not leak; one step is not a trend."""
    from drumsbench.measure.leaks import MIN_RISES, judge

    rows: list[list[float | None]] = []
    for i, files in enumerate(LEAKY_TMP):
        rows.append([1000.0 + i * 0.25, float(files), float(20 + i % 10), float(i >= 30)])
    art = artifacts.LeakSamplesArtifact(substrate="process", interval_s=0.25,
                                        columns=["t", "tmp_entries", "fds", "shm_entries"], rows=rows,
                                        before={}, after={})
    verdict = judge(art, 1000.0, span_to=1000.0 + len(rows) * 0.25, span_from=1000.0)
    by = {sl.key: sl for sl in verdict.slopes}
    tmp, fds, shm = by["tmp_entries"], by["fds"], by["shm_entries"]
    assert tmp.low is None and tmp.n_effective is not None and tmp.n_effective < 4, \
        "the interval alone would judge it: this test would prove nothing"
    assert tmp.rises is not None and tmp.rises >= MIN_RISES and tmp.falls == 0 and tmp.leaks is True
    assert fds.rises == 59 and fds.falls == 6 and fds.leaks is not True
    assert shm.rises == 1 and shm.leaks is not True
    assert verdict.passed is False and "entries in the host's /tmp" in verdict.detail and "never fell" in verdict.detail
    assert "open fds" not in verdict.detail


def test_a_count_must_leak_a_whole_unit_over_the_span():
    """A 10-s window whose zombie count flickers between 0 and 1 near its end (not yet reaped): the
    slope's low end is above 5/h (its tolerance: 1/h), yet it comes to half a zombie over the span (the clean sweep's
    step window failed on this in a CI rehearsal); one more zombie every second is a leak."""
    from drumsbench.measure.leaks import judge

    flicker = [0.0] * 28 + [1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    rows: list[list[float | None]] = [[1000.0 + i * 0.25, v, float(i // 4)] for i, v in enumerate(flicker)]
    art = artifacts.LeakSamplesArtifact(substrate="process", interval_s=0.25, columns=["t", "zombies", "processes"],
                                        rows=rows, before={}, after={})
    verdict = judge(art, 1000.0, span_to=1010.0, span_from=1000.0)
    by = {sl.key: sl for sl in verdict.slopes}
    low = by["zombies"].low
    assert low is not None and low > 5 * by["zombies"].tolerance_per_h, "the slope alone would call it a leak"
    assert by["zombies"].leaks is False
    assert by["processes"].leaks is True and verdict.passed is False and "zombies" not in verdict.detail


# -- the sampler ------------------------------------------------------------------------------------------


def test_the_sampler_sees_fds_processes_and_files(tmp_path):
    tmp, shm, store = tmp_path / "tmp", tmp_path / "shm", tmp_path / "store"
    for d in (tmp, shm, store):
        d.mkdir()
    s = leak_sampler.LeakSampler("process", interval_s=0.05, tmp=str(tmp), shm=str(shm), store=store)
    base = s.sample()
    held = [open(os.devnull) for _ in range(5)]  # noqa: SIM115
    (tmp / "a").mkdir()
    (tmp / "a" / "b").write_text("x")
    (store / "f").write_bytes(b"\0" * (1 << 20))
    import subprocess

    child = subprocess.Popen(["sleep", "30"])
    try:
        now = s.sample()
    finally:
        child.kill()
        child.wait()
        for f in held:
            f.close()
    assert now["fds"] - base["fds"] >= 5
    assert now["processes"] - base["processes"] >= 1
    assert now["tmp_entries"] - base["tmp_entries"] == 2
    assert now["store_mib"] - base["store_mib"] >= 0.99
    assert base["mounts"] > 0 and base["zombies"] is not None and "daemon_mib" not in base
    art = s.start().stop()
    assert art.columns[0] == "t" and art.rows and art.before and art.after and art.sample_ms is not None


def test_the_sampler_counts_the_runs_own_mounts_not_the_hosts(tmp_path):
    """A mount under the run's folder counts; one elsewhere on the host (another user's) does not."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    run_id = "r20990101-000000-leak"
    ours, theirs = tmp_path / run_id / "box", tmp_path / "someone-else" / "box"
    for d in (ours, theirs):
        d.mkdir(parents=True)
    s = leak_sampler.LeakSampler("process", interval_s=0.05, tmp=str(tmp_path), shm=str(tmp_path), store=tmp_path,
                                 run_id=run_id)
    host = leak_sampler.LeakSampler("process", interval_s=0.05, tmp=str(tmp_path), shm=str(tmp_path),
                                    store=tmp_path)
    base, base_host = s.sample()["mounts"], host.sample()["mounts"]
    mounted = []
    try:
        for d in (ours, theirs):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
            mounted.append(d)
        assert s.sample()["mounts"] == base + 1
        assert host.sample()["mounts"] >= base_host + 2  # the whole table: others may mount meanwhile
        # the artifact says what was counted, and the verdict labels it so
        from drumsbench.measure import leaks

        for sampler, label in ((s, "mounts of the run"), (host, "the host's whole table")):
            art = sampler.start().stop()
            assert art.mounts_of_run == (run_id if sampler is s else None)
            t0 = art.rows[0][0]
            verdict = leaks.judge(art, t0, span_to=art.rows[-1][0] + 1, span_from=t0)
            assert any(sl.key == "mounts" and label in sl.label for sl in verdict.slopes), verdict.slopes
    finally:
        for d in mounted:
            subprocess.run(["umount", str(d)], check=False)


# -- the positive control: real sweeps on the process substrate ------------------------------------------------


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The sweep's state in tmp_path; the sampler's /tmp and /dev/shm pointed at folders of this test
    (the real ones are shared with the rest of the machine, whose churn is not this test's)."""
    monkeypatch.setenv("DRUMSBENCH_STATE", str(tmp_path / "state"))
    for name in ("tmp", "shm"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(leak_sampler, "HOST_TMP", str(tmp_path / "tmp"))
    monkeypatch.setattr(leak_sampler, "HOST_SHM", str(tmp_path / "shm"))
    return tmp_path


def _sweep(folder: Path, run_id: str, seconds: float = 10.0):
    """A step window N2 then a soak at N2, each ``seconds`` long."""
    ledger = Ledger(folder / f"{run_id}.sqlite")
    # no warm pool: its background creates move the harness's process count in steps, which a 10-s clean
    # window can mistake for a slope (the CI rehearsal saw +344 processes/h once)
    cfg = SweepConfig(base=RunConfig(substrate="process", tasks="coding", policy="oracle", pool=0), concurrency=[2],
                      window_s=seconds, soak_s=seconds, stability=1.0)
    ledger.create_run(run_id, "sweep", cfg.model_dump(mode="json"), {}, "test")
    run_sweep(ledger, run_id, cfg)
    report = build(ledger, run_id)
    publish(ledger, run_id, report)
    return ledger, report


def test_a_deliberate_leak_fails_the_leak_check_and_a_clean_sweep_passes(host, monkeypatch):
    from drumsbench.envs.coding.env import CodingEnv

    _, clean = _sweep(host, "clean")
    assert [w.label for w in clean.windows] == ["N2", "soak-N2"]
    for w in clean.windows:
        assert w.leaks is not None and w.leaks.passed is True, w.leaks
    assert clean.leaks_passed is True

    kept: list = []
    tmp = Path(leak_sampler.HOST_TMP)
    reset = CodingEnv.reset

    def leaky_reset(self, task):  # every attempt keeps a file descriptor and leaves a file in /tmp
        kept.append(open(os.devnull))  # noqa: SIM115
        (tmp / f"leak-{len(kept)}").write_text("x")
        return reset(self, task)

    monkeypatch.setattr(CodingEnv, "reset", leaky_reset)
    try:
        ledger, leaky = _sweep(host, "leaky")
    finally:
        for f in kept:
            f.close()
    step, w = leaky.windows
    assert len(kept) > 20
    for v in (step, w):
        assert v.leaks is not None and v.leaks.passed is False, v.leaks
        assert "fds" in {s.key for s in v.leaks.leaking}, v.leaks.detail
    # the files too, in both windows: a file per attempt only ever rises (the staircase rule; its
    # residuals can be too autocorrelated for the slope's interval, see LEAKY_TMP)
    for v in (step, w):
        assert v.leaks is not None and "tmp_entries" in {s.key for s in v.leaks.leaking}, v.leaks.detail
    assert leaky.leaks_passed is False and leaky.leaks_note.startswith("leak check FAILED in soak-N2 (fds")
    # the step window's failure is named, as not counted (a step window's minutes are warm-up)
    assert "failed in step windows (warm-up, not counted): N2 (fds" in leaky.leaks_note, leaky.leaks_note
    assert clean.leaks_note.startswith("leak check passed in every soak (1 of 2 windows counted)"), clean.leaks_note
    assert step.leaks.left["tmp_entries"] + w.leaks.left["tmp_entries"] == len(kept)
    # the soak that leaks is not confirmed, for that reason alone; a step window shows its leak check
    # without counting it (its minutes are warm-up); the clean soak is confirmed with the check passed
    assert [c.name for c in w.checks] == ["full_length", "invalid_rate", "isolation_control", "stable", "leaks"]
    assert not w.confirmed and [c.name for c in w.checks if not c.passed] == ["leaks"], w.checks
    assert "LEAKS" in w.verdict_line() and leaky.n_max == 2 and not leaky.soak_held
    assert step.confirmed and "leaks" not in [c.name for c in step.checks]
    cw = clean.windows[1]
    assert cw.confirmed and cw.checks[-1].name == "leaks" and cw.checks[-1].passed, cw.checks
    # the samples are in the ledger, the verdict in the window artifact and the JSON
    assert artifacts.load(ledger, "leaky", artifacts.LeakSamplesArtifact)["soak-N2"].rows
    art = artifacts.load(ledger, "leaky", artifacts.WindowArtifact)["soak-N2"]
    assert art.leaks is not None and art.leaks.passed is False
    assert json.loads(json.dumps(leaky.dump()))["windows"][1]["leaks"]["passed"] is False
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render(leaky))
    text = console.export_text()
    assert "FAIL: fds" in text and "LEAKING" in text
    # and in the sweep section of the HTML report
    from drumsbench.report.html import write_html

    page = write_html(ledger, ["leaky"], host / "leaky.html").read_text()
    assert 'data-key="leaky/leaks/soak-N2/passed"' in page and "FAIL: fds" in page and "Leak check:" in page
    assert 'data-key="leaky/sweep/leaks_passed">LEAKING</b> (leak check FAILED in soak-N2 (fds' in page


def test_the_sampler_reads_dockerd_memory_on_docker(tmp_path):
    import shutil
    import subprocess

    from conftest import require

    up = shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    require(None if up else "docker is not running")
    s = leak_sampler.LeakSampler("docker", interval_s=0.05, tmp=str(tmp_path), shm=str(tmp_path), store=tmp_path)
    v = s.sample()
    assert "daemon_mib" in s.columns and v["daemon_mib"] is not None and v["daemon_mib"] > 1, (v, s.notes)


def test_run_watch_samples_leaks_beside_a_plain_run_and_reports_them(tmp_path):
    """`drumsbench run --watch`: a leaks artifact per segment, judged in the run's report (terminal and
    JSON) from the ledger alone; a run without --watch has none."""
    from helpers import cli

    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "runs"
    proc = cli("run", "--watch", "--duration", "8s", "--concurrency", "2", "--out", str(out), "--json",
               str(tmp_path / "w.json"), "--no-progress", env=env, check=True)
    data = json.loads((tmp_path / "w.json").read_text())
    (name,) = data["leaks"]
    verdict = data["leaks"][name]
    assert name == "run-segment-0" and {s["key"] for s in verdict["slopes"]} >= {"fds", "processes", "mounts"}
    assert verdict["samples"] >= 5 and f"leak check ({name})" in proc.stdout
    again = cli("report", data["run_id"], "--out", str(out), "--json", str(tmp_path / "again.json"), env=env,
                check=True)
    assert json.loads((tmp_path / "again.json").read_text())["leaks"][name]["slopes"] == verdict["slopes"]
    assert f"leak check ({name})" in again.stdout
    cli("run", "--attempts", "2", "--out", str(out), "--json", str(tmp_path / "plain.json"), "--no-progress",
        env=env, check=True)
    assert "leaks" not in json.loads((tmp_path / "plain.json").read_text())


def test_the_sampler_counts_every_shared_place_a_sandbox_uid_can_write():
    """/run/lock and /var/tmp are written by sandbox uids as /tmp is (a stash there outlived its
    sandbox): they count in ``tmp_entries``, each place once."""
    sampler = leak_sampler.LeakSampler("process")
    assert {"/tmp", "/var/tmp", "/run/lock"} <= set(sampler.tmp_roots) and "/dev/shm" not in sampler.tmp_roots
    assert not any(a != b and a.startswith(b + "/") for a in sampler.tmp_roots for b in sampler.tmp_roots)
    before, _ = leak_sampler._walk("/run/lock", leak_sampler.ENTRY_CAP)
    path = Path(f"/run/lock/.drumsbench-test-{os.getpid()}")
    path.write_text("x")
    try:
        after, _ = leak_sampler._walk("/run/lock", leak_sampler.ENTRY_CAP)
    finally:
        path.unlink()
    assert before is not None and after == before + 1
