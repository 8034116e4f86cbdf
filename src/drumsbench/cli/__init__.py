"""``drumsbench``: the command line.

One module per command (or tight group of commands); the options they share are in ``options.py``,
the console, progress and usage-error plumbing in ``common.py``, and the tables they print in
``drumsbench.report``. Every command is registered here, and only here.

Every user error is one line on stderr naming the flag and the fix, exit code 2, no traceback.
"""

from __future__ import annotations

import sqlite3
import sys

import typer

from drumsbench.cli import (
    branch,
    chaos,
    cluster,
    coldstart,
    gc,
    isolation,
    project,
    report,
    run,
    serve,
    substrates,
    sweep,
    tasks,
    train,
)
from drumsbench.core.errors import DrumsError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Run and judge the infrastructure under RL agents' rollouts.")
tasks_app = typer.Typer(no_args_is_help=True, help="Task suites.")

for command in (run.run, report.report, gc.gc, substrates.doctor, substrates.conformance, sweep.sweep,
                project.project, branch.branch, serve.serve, coldstart.coldstart, isolation.isolation, train.train,
                chaos.chaos):
    app.command()(command)
app.add_typer(tasks_app, name="tasks")
cluster_app = typer.Typer(no_args_is_help=True, help="A multi-node Ray cluster on this machine (loopback only).")
app.add_typer(cluster_app, name="cluster")
cluster_app.command("up")(cluster.cluster_up)
cluster_app.command("down")(cluster.cluster_down)
for name, command in (("list", tasks.tasks_list), ("fingerprint", tasks.tasks_fingerprint),
                      ("check", tasks.tasks_check), ("make", tasks.tasks_make)):
    tasks_app.command(name)(command)


def main() -> None:
    try:
        app()
    except DrumsError as e:
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)  # one line, whatever it quotes
        sys.exit(2)
    except sqlite3.OperationalError as e:  # the ledger refused a write outside an attempt's (e.g. a full disk
        # while a run starts); what was committed stays, SQLite rolled back the rest
        print(f"error: the ledger could not be written ({e}); make room or fix the --out folder, then resume "
              "the run (`drumsbench run --resume RUN`)", file=sys.stderr)
        sys.exit(2)
