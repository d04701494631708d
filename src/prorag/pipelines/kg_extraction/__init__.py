"""KG extraction pipeline (TeaRAG §4.1)."""

from prorag.pipelines.kg_extraction.pipeline import attach_pipeline, create_pipeline

__all__ = ["attach_pipeline", "create_pipeline"]
