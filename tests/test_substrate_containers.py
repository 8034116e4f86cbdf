"""Container substrates (docker, podman): no network, labels, gc of dead runs, image caching."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from drumsbench.core.errors import SubstrateError
from drumsbench.substrates import registry
from drumsbench.substrates.containers import common as C

from conftest import require

ENGINES = ["docker", "podman"]


@pytest.fixture(params=ENGINES)
def sub(request, run_id, state_dir):
    cls = registry.get(request.param)
    require(cls.missing())
    s = cls(run_id, state_dir)
    yield s
    s.close()
    cls.gc(state_dir, {run_id})  # whatever a failed test left (run ids are unique per test)


def labels_of(sub, box) -> dict[str, str]:
    if sub.name == "docker":
        return sub.client.api.inspect_container(box.container_id)["Config"]["Labels"]
    from drumsbench.substrates.containers.podman_cli import podman

    info = json.loads(podman(["container", "inspect", box.container_id]).stdout)
    return info[0]["Config"]["Labels"]


def remove_behind_its_back(sub, cid: str) -> None:
    if sub.name == "docker":
        sub.client.api.remove_container(cid, force=True)
    else:
        from drumsbench.substrates.containers.podman_cli import podman

        podman(["rm", "--force", "--time", "0", cid])


def test_no_network(sub):
    """Only lo exists, and the host's loopback listener is unreachable from the container."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    box = sub.create()
    try:
        res = box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", timeout=10)
        assert res.stdout.split() == [b"lo"], res
        probe = (
            "import socket\n"
            "s = socket.socket()\n"
            "s.settimeout(2)\n"
            "try:\n"
            f"    s.connect(('127.0.0.1', {port}))\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', type(e).__name__)\n"
        )
        res = box.exec(["python3", "-c", probe], timeout=10)
        assert res.stdout.startswith(b"refused"), res
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        box.destroy()
        listener.close()


def test_labels(sub, run_id):
    box = sub.create()
    try:
        labels = labels_of(sub, box)
        assert labels[C.LABEL_RUN] == run_id
        assert labels[C.LABEL_SANDBOX] == box.id
        assert sub.leftovers() and box.container_id[:12] in sub.leftovers()[0]
    finally:
        box.destroy()
    assert sub.leftovers() == []


def test_gc_removes_dead_runs_only(sub, run_id, state_dir):
    cls = type(sub)
    live = cls(run_id + "live", state_dir)
    keep = live.create()
    try:
        for _ in range(3):
            sub.create()  # forgotten: as if the run had crashed
        assert len(sub.leftovers()) == 3
        removed = cls.gc(state_dir, {run_id})
        assert len(removed) == 3, removed
        assert sub.leftovers() == []
        assert keep.exec("echo alive", timeout=10).stdout == b"alive\n"
    finally:
        keep.destroy()
        live.close()
        cls.gc(state_dir, {run_id})


def test_timeout_kills_processes_that_cleared_their_env(sub):
    box = sub.create()
    try:
        res = box.exec("env -i sleep 61 & sleep 62", timeout=0.5)
        assert res.timed_out and res.exit_code == -9
        probe = box.exec("ps -eo args | grep -c '^sleep 6[12]' || true", timeout=10)
        assert probe.stdout.strip() == b"0", probe
    finally:
        box.destroy()


def test_reset_in_place_cleans_shared_temp(sub):
    box = sub.create()
    try:
        box.exec(
            "echo x > /tmp/left; echo y > /sandbox/verify/v; (sleep 63 >/dev/null 2>&1 &)",
            timeout=10,
        )
        box.reset_in_place()
        res = box.exec("ls -A /tmp /sandbox/verify; ps -eo args | grep -c '^sleep 63'", timeout=10)
        assert res.stdout == b"/sandbox/verify:\n\n/tmp:\n0\n", res
        assert (
            box.exec("pwd; touch $TMPDIR/t && echo ok", timeout=10).stdout == b"/sandbox/work\nok\n"
        )
    finally:
        box.destroy()


PERSISTENT = {  # a change a policy's command (the container's root) leaves outside the sandbox's folders
    "/etc/drumsbench-poison.xcd": "echo x > /etc/drumsbench-poison.xcd",
    "/root/.profile": "echo 'export PATH=/sandbox/work:$PATH' >> /root/.profile",
    "/sandbox/start.odt": "echo stash > /sandbox/start.odt",
    "/usr/lib/python3/dist-packages/sitecustomize.py":
        "echo 'import os' > /usr/lib/python3/dist-packages/sitecustomize.py",
    "/etc/motd": "rm -f /etc/motd",
}


@pytest.mark.parametrize("path", sorted(PERSISTENT))
def test_a_reset_in_place_refuses_a_change_outside_the_sandboxs_folders(sub, path):
    """Positive control first: the reset's script alone keeps the change for the next attempt; the
    reset in place then refuses (``SubstrateError``: the rollout makes a fresh sandbox); changes in
    the sandbox's folders and temp places pass."""
    box = sub.create()
    try:
        before = box.exec(f"ls -la {path} 2>&1; md5sum {path} 2>&1", timeout=10).stdout
        box.exec(f"echo in > /sandbox/work/w; echo t > /tmp/t; mkdir -p /sandbox/home/.cache/x; {PERSISTENT[path]}",
                 timeout=10)
        box._run_checked(["/bin/sh", "-c", C.RESET_SCRIPT], "the reset's script alone")
        assert box.exec(f"ls -la {path} 2>&1; md5sum {path} 2>&1", timeout=10).stdout != before
        with pytest.raises(SubstrateError, match="cannot undo: .*" + re.escape(path)):
            box.reset_in_place()
    finally:
        box.destroy()
    clean = sub.create()
    try:
        clean.exec("echo in > /sandbox/work/w; echo t > /tmp/t; echo v > /var/tmp/v; mkdir -p /sandbox/home/.c/x",
                   timeout=10)
        clean.reset_in_place()  # only the sandbox's folders and temp places changed
    finally:
        clean.destroy()


def test_container_removed_behind_its_back_is_a_substrate_error(sub):
    box = sub.create()
    remove_behind_its_back(sub, box.container_id)
    with pytest.raises(SubstrateError):
        box.exec("true", timeout=10)
    with pytest.raises(SubstrateError):
        box.read_file(f"{box.paths.work}/x")
    box.destroy()  # still idempotent


def test_image_is_cached(sub, monkeypatch):
    """A second ensure_image neither rebuilds nor imports: same image, no progress, fast."""
    if sub.name == "docker":
        from drumsbench.substrates.containers.docker import ensure_image

        def image_id(tag):
            return sub.client.api.inspect_image(tag)["Id"]
    else:
        from drumsbench.substrates.containers.podman import ensure_image
        from drumsbench.substrates.containers.podman_cli import podman

        def image_id(tag):
            return json.loads(podman(["image", "inspect", tag]).stdout)[0]["Id"]

    tag = ensure_image()
    before = image_id(tag)
    said: list[str] = []
    monkeypatch.setattr(C, "progress", said.append)

    def no_rootfs(engine):
        raise AssertionError("the rootfs must not be rebuilt")

    monkeypatch.setattr(C, "ensure_rootfs_tar_verbose", no_rootfs)
    t0 = time.monotonic()
    assert ensure_image() == tag
    assert time.monotonic() - t0 < 5
    assert said == []
    assert image_id(tag) == before


def test_gc_removes_a_crashed_builds_container(sub, run_id, state_dir):
    """The throw-away container of an image build that crashed is removed when no build runs."""
    from drumsbench import images

    name = f"{C.BUILD_PREFIX}test-{run_id}"
    if sub.name == "docker":
        sub.client.api.create_container(
            images.rootfs_tag(),
            command=["true"],
            name=name,
            host_config=sub.client.api.create_host_config(network_mode="none"),
        )
    else:
        from drumsbench.substrates.containers.podman_cli import podman

        podman(["create", "--network", "none", "--name", name, images.rootfs_tag(), "true"])
    removed = type(sub).gc(state_dir, {run_id})
    assert any("build container" in line for line in removed), removed
