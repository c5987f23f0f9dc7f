"""Views: the pieces of text, tables and figures each command shows, one module per subject
(``compare``, ``metadata``, ``regime``, ``stage``, ``sweep``, ``transfer``, ``validate``).
The terminal and HTML renderers (``reports/terminal*.py``, ``reports/html_report.py``) and
the commands compose them; a view computes nothing the analysis does not hand it."""

__all__: list[str] = []
