"""Test-wide settings.

Under CI (``CI`` set in the environment) Hypothesis runs derandomized: the same examples
every run, so a landing never depends on luck; local runs keep exploring new examples.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
