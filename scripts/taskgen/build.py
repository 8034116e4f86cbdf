"""Generate bug/golden/wrong patches and task.toml for every task in tasks_spec.TASKS.

Patches are real `git diff` output from a scratch repository per task.
Usage: python3 build.py SUITE_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drumsbench.core.fingerprint import tree_digest  # noqa: E402
from tasks_spec import TASKS  # noqa: E402

GIT = ["git", "-c", "user.name=gen", "-c", "user.email=gen@example.invalid",
       "-c", "core.autocrlf=false", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
       "-c", "core.quotepath=false"]
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def git(cwd, *args):
    return subprocess.run(GIT + list(args), cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def edit(root, edits):
    for rel, old, new in edits:
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        n = text.count(old) if old else 0
        if n != 1:
            raise SystemExit(f"{rel}: expected 1 occurrence, found {n}: {old!r}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))


def diff(root):
    out = git(root, "diff", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/")
    if not out.strip():
        raise SystemExit(f"empty diff in {root}")
    git(root, "checkout", "-q", "--", ".")
    return out


def toml_str(text):
    body = text.replace("\\", "\\\\").replace('"""', '""\\"')
    return '"""' + body + '"""'


def main(suite):
    for spec in TASKS:
        tid, project = spec["id"], spec["project"]
        task_dir = os.path.join(suite, tid)
        os.makedirs(task_dir, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            repo = os.path.join(tmp, "repo")
            shutil.copytree(os.path.join(suite, "projects", project), repo, ignore=IGNORE)
            git(repo, "init", "-q")
            git(repo, "add", "-A")
            git(repo, "commit", "-qm", "correct")
            edit(repo, spec["bug"])
            bug = diff(repo)
            edit(repo, spec["bug"])
            git(repo, "commit", "-qam", "start")
            golden_edits = spec["golden"] or [(f, new, old) for f, old, new in reversed(spec["bug"])]
            edit(repo, golden_edits)
            golden = diff(repo)
            wrongs = []
            for edits in spec["wrong"]:
                edit(repo, edits)
                wrongs.append(diff(repo))
            # start fingerprint: clean copy of the project + bug.patch via git apply
            start = os.path.join(tmp, "start")
            shutil.copytree(os.path.join(suite, "projects", project), start, ignore=IGNORE)
            subprocess.run(["git", "apply", "-"], input=bug, text=True, cwd=start, check=True,
                           env={**os.environ, "GIT_CEILING_DIRECTORIES": tmp})
            fingerprint = tree_digest(start)
        with open(os.path.join(task_dir, "bug.patch"), "w") as f:
            f.write(bug)
        with open(os.path.join(task_dir, "golden.patch"), "w") as f:
            f.write(golden)
        names = ["wrong.patch"] + [f"wrong-{i}.patch" for i in range(2, len(wrongs) + 1)]
        for name, text in zip(names, wrongs):
            with open(os.path.join(task_dir, name), "w") as f:
                f.write(text)
        hidden = sorted(f"hidden/{n}" for n in os.listdir(os.path.join(task_dir, "hidden"))
                        if n.startswith("test_") and n.endswith(".py"))
        toml = "\n".join([
            f'id = "{tid}"',
            f'project = "{project}"',
            f"description = {toml_str(spec['description'])}",
            'bug_patch = "bug.patch"',
            'golden_patch = "golden.patch"',
            "wrong_patches = [" + ", ".join(f'"{n}"' for n in names) + "]",
            "hidden_tests = [" + ", ".join(f'"{h}"' for h in hidden) + "]",
            f'start_fingerprint = "{fingerprint}"',
            "",
            "[verify]",
            "timeout_s = 30",
            "",
        ])
        data = tomllib.loads(toml)
        assert data["description"] == spec["description"], tid
        with open(os.path.join(task_dir, "task.toml"), "w") as f:
            f.write(toml)
        print(tid, fingerprint)


if __name__ == "__main__":
    main(sys.argv[1])
