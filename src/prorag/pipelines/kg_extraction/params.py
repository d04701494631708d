"""Parameter schema of the kg_extraction pipeline (``kg_extraction``; see conf/base/parameters_kg_extraction.yml).

The schema is :mod:`prorag.kg.params`, shared with the tearag and compare pipelines.
"""

from prorag.kg.params import ChunkSelection, ExtractionParams, ExtractorSpec, KagParams, KgExtractionParams

__all__ = ["ChunkSelection", "ExtractionParams", "ExtractorSpec", "KagParams", "KgExtractionParams"]
