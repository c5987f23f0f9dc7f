"""``python -m ttft.reports.cli``: the ``ttft`` command."""

from ttft.reports.cli import main

main()
