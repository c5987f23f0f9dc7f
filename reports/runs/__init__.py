"""ttft.reports.runs: the runs that drive several packages at once (the library never
orchestrates): ``demo`` (serve, trace, analyse, report), ``validate`` (inject delays, check
that attribution gives them back) and the prefill profile."""

__all__: list[str] = []
