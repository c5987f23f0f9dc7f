"""One colour per stage, shared by the HTML figures and the terminal report."""

from __future__ import annotations

COLOURS = {
    "client": "#9aa5b1",
    "connect": "#52606d",
    "network": "#cbd2d9",
    "untraced": "#e0c9a6",
    "server": "#7b8794",
    "route": "#5e548e",
    "tokenize": "#f7b267",
    "queue": "#e4572e",
    "schedule": "#f4845f",
    "batch_wait": "#c0392b",
    "preempted": "#7b241c",
    "prefill": "#76b041",
    "prefill.chunk": "#2e8b57",
    "kv_transfer": "#8d6e63",
    "forward": "#4a90d9",
    "gpu": "#1d3557",
    "sample": "#9b5de5",
    "detokenize": "#f15bb5",
    "holdback": "#ffd166",
    "deliver": "#06d6a0",
    "stream": "#00bbf9",
    "step": "#d9d9d9",
    "other": "#b8b08d",
    "unattributed": "#eeeeee",
}


def colour(stage: str) -> str:
    """The stage's colour everywhere (grey for stages without one)."""
    return COLOURS.get(stage, "#999999")
