"""The lines ``ttft trace`` and ``ttft demo`` print about the load a run made: the rate
achieved against the rate offered, and one yellow line when the server did not keep up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:  # the load generator is imported by the commands that run it, not --help
    from ttft.collectors.load_rates import LoadRates

__all__ = ["load_lines", "print_load"]


def load_lines(load: LoadRates) -> list[Text]:
    """The achieved-rate line and, when the achieved rate is below ``KEPT_UP_FRACTION`` of
    the offered one (:meth:`LoadRates.kept_up` False), the overload line, in yellow."""
    from ttft.collectors.load_rates import KEPT_UP_FRACTION
    achieved = (f"{load.achieved_rate_per_s:.2f} requests/s"
                if load.achieved_rate_per_s is not None else "unknown")
    offered = (f"; the schedule offered {load.offered_rate_per_s:.2f} requests/s"
               if load.offered_rate_per_s is not None else "; closed loop or burst: no "
               "offered rate")
    lines = [Text(f"achieved rate: {achieved} ({load.completed} of {load.requests} completed "
                  f"in {load.load_s:.1f} s{offered})")]
    if load.kept_up() is False:
        assert load.offered_rate_per_s is not None and load.achieved_rate_per_s is not None
        lines.append(Text(
            f"the server did not keep up: offered {load.offered_rate_per_s:.2f} requests/s, "
            f"achieved {load.achieved_rate_per_s:.2f} requests/s (under "
            f"{KEPT_UP_FRACTION:.0%} of it), so TTFT includes queueing from overload; "
            "lower --rate to see it unloaded", style="yellow"))
    return lines


def print_load(console: Console, load: LoadRates) -> None:
    """Print :func:`load_lines` on ``console``, each unwrapped."""
    for line in load_lines(load):
        console.print(line, soft_wrap=True)
