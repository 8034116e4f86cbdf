"""Harbor task images on the ``vm`` substrate (issue 32, item 2): the image a container engine built
becomes a guest disk (its layers under the sandbox folders) and a booted snapshot of its own; every
attempt is a fork of it. Harbor's oracle/nop check on two example tasks — one verified in its own
image, one in a separate verifier image with pytest — and an image ``ENV`` that reaches test.sh; the
guest disk's build leaves no mount and no build folder behind, and detaches one a killed build
left. (The whole example set is a command:
``drumsbench tasks check harbor:examples/harbor --substrates vm``, about 7 minutes under TCG with
every image new; docs/harbor.md.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from drumsbench import images
from drumsbench.experiments.harbor_check import check_harbor
from drumsbench.substrates import registry

from conftest import require

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "harbor"


def test_harbor_tasks_score_as_harbor_says_in_vm_guests_of_their_images(tmp_path: Path) -> None:
    require(registry.get("vm").missing())
    suite = tmp_path / "suite"
    for name in ("count-words", "fix-median"):
        shutil.copytree(EXAMPLES / name, suite / name)
    # the image's ENV must reach the verifier's commands in the guest: without it the oracle scores 0
    env_task = suite / "count-words"
    dockerfile = env_task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "ENV DRUMS_MARK=from-the-image\n")
    test_sh = env_task / "tests" / "test.sh"
    lines = test_sh.read_text().splitlines(keepends=True)
    test_sh.write_text(lines[0] + '[ "$DRUMS_MARK" = from-the-image ] || { echo 0 > /logs/verifier/reward.txt; '
                       "exit 0; }\n" + "".join(lines[1:]))
    # a guest disk's build killed while its layers were mounted: the next build detaches that mount
    stale = images.cache_dir() / ".vm-root-build-killed"
    stale.mkdir(parents=True, exist_ok=True)
    (tmp_path / "l1").mkdir()
    (tmp_path / "l2").mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={tmp_path / 'l1'}:{tmp_path / 'l2'}",
                    str(stale)], check=True)
    results = check_harbor(f"harbor:{suite}", ["vm"], tmp_path / "state")
    assert [(c.task, c.ok) for c in results] == [("count-words", True), ("fix-median", True)], \
        [c.problem for c in results]
    assert all(c.golden.startswith("success") and c.start.startswith("failed") for c in results), results
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
    assert ".vm-root-build-" not in mounts, mounts  # the stale one too
    assert not list(images.cache_dir().glob(".vm-root-build-*"))
    assert not list((tmp_path / "state").glob("vm/*/_skeleton")), "the run's skeleton was left"
