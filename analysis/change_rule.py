"""What ``ttft compare`` counts as a change, apart from the statistics that test it: the
multiple-comparison correction and the practical floor. Its own module, importing nothing,
so the command line shows these defaults (``ttft compare --help``) without loading the
analysis."""

CORRECTION = "holm"
"""The multiple-comparison correction of every p-value: Holm's step-down method (weighted,
see ``analysis.compare.TTFT_SHARE``)."""
FLOOR_MS = 0.1
"""The practical floor's absolute part: a smaller delta (ms) is never a change."""
FLOOR_PCT = 1.0
"""The practical floor's relative part: a delta under this percent of A's value is never
a change."""
