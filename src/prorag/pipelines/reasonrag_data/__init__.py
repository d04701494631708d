"""ReasonRAG process-supervised data (RAG-ProGuide construction): MCTS trees with SPRE values → step-level pairs."""

from prorag.pipelines.reasonrag_data.pipeline import create_pipeline

__all__ = ["create_pipeline"]
