"""One self-contained, offline HTML report of one or more runs, built from the ledger alone.

``build_html(ledger, run_ids)`` returns the page; ``write_html(ledger, run_ids, path)`` writes it.
The page has inline CSS and inline SVG plots (``report/svg.py``): no script, no font, no image and
no stylesheet is fetched from anywhere; screenshots are embedded as ``data:`` URIs. Several runs are
shown side by side: tables get one column per run, plots one colour per run (and substrate).

Sections (docs/html-report.md lists the artifact kinds and shapes each one reads), one module each
family, on what every section shares (``data``: one run's figures; ``cells``: tables, numbers, plot
rows, colours) and framed by ``page``:
- ``run``: headline per run; outcomes (success, failed, every invalid cause on its own line);
  per task; positive controls; machine, commit, configuration and price inputs;
- ``costs``: valid rollouts per host-hour and USD per valid rollout per price input, with intervals;
  completions over time;
- ``coldstart``: cold start and phase latency per substrate (CDFs and a percentile table);
- ``isolation``: escape probes; ``sweep``: throughput and invalid rate against N, confirmed windows,
  N_max, and the soak; ``branch``: results per fork method; ``projection``: the worker-hour
  projection; ``training``: learning curves per treatment; ``screenshots``.
A section whose data no run has is left out; a section that fails to render says so in place and
the rest of the page is still written.
"""

from drumsbench.report.html.page import build_html, write_html

__all__ = ["build_html", "write_html"]
