"""Importers: trace files of other systems → ttft's span table.

Each format is one module with one small class (``name``, ``guess_can_open(path)``,
``read(path) -> pyarrow.Table``), registered in `IMPORTERS`. Read traces through
:func:`ttft.collectors.read_spans`, which picks the format (or takes the one named), reads,
and maps serving stacks' span names onto ttft's stages (`ttft.collectors.importers.mapping`),
so every command attributes any of them with the same rules.
"""

from __future__ import annotations

from ttft.collectors.importers._base import Importer, rows_to_table
from ttft.collectors.importers.chrome import ChromeTrace
from ttft.collectors.importers.dynamo import DynamoRequestTrace
from ttft.collectors.importers.jaeger import JaegerJSON
from ttft.collectors.importers.otlp import OTLPJsonLines, OTLPProto
from ttft.collectors.importers.ttft_parquet import TTFTParquet

IMPORTERS: dict[str, Importer] = {i.name: i for i in (
    TTFTParquet(), JaegerJSON(), ChromeTrace(), OTLPJsonLines(), OTLPProto(),
    DynamoRequestTrace())}
"""Every importer by name, in the order `guess_format` tries them."""

__all__ = ["IMPORTERS", "Importer", "rows_to_table"]
