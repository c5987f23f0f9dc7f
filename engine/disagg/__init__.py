"""Disaggregated prefill and decode (``ttft serve --disaggregate``).

``DisaggEngine`` (``decode``) is the decode worker, in the API server's process, with
``Engine``'s interface; its prefill worker is a child process (``process``, ``worker``)
running a ``PrefillEngine`` (``prefill``). K/V blocks and the first token cross over a
socket on 127.0.0.1 (``channel``), or the blocks through a shared-memory ring with only
control messages on the socket (``shm``, ``kv_channel="shm"``); the worker's spans come
back over the socket (``span_wire``).
"""

from ttft.engine.disagg.decode import API_SIDE_DELAYS, FIRST_TOKEN_MODES, DisaggEngine
from ttft.engine.disagg.process import WorkerFailed

__all__ = ["API_SIDE_DELAYS", "FIRST_TOKEN_MODES", "DisaggEngine", "WorkerFailed"]
