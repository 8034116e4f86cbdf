"""`python -m drumsbench` = the `drumsbench` command."""

from drumsbench.cli import main

main()
