"""KG extraction (TeaRAG §4.1): index chunks → LLM triplets → knowledge graph with FAISS indexes → report."""

from kedro.pipeline import Node, Pipeline

from prorag.pipelines import tags
from prorag.pipelines.kg_extraction.nodes import (
    attach_knowledge_graph,
    build_kg,
    extract_kg_triplets,
    report_kg,
    select_kg_chunks,
)


def create_pipeline(**kwargs: object) -> Pipeline:
    """Select chunks of the built index, extract triplets (cached, resumable), build the KG, report (namespace
    ``kg_extraction``)."""
    return Pipeline([
        Node(select_kg_chunks, ["retrieval_index", "index_questions", "params:kg_extraction"], "kg_chunks",
             name="select_kg_chunks"),
        Node(extract_kg_triplets, ["kg_chunks", "params:kg_extraction"], ["kg_triplets", "kg_extraction_stats"],
             name="extract_kg_triplets"),
        Node(build_kg, ["kg_triplets", "retrieval_index", "kg_extraction_stats"], "knowledge_graph",
             name="build_knowledge_graph"),
        Node(report_kg, ["knowledge_graph", "kg_extraction_stats"], ["kg_extraction_report", "kg_extraction_metrics"],
             name="report_kg_extraction"),
    ], namespace="kg_extraction", prefix_datasets_with_namespace=False, tags=[tags.DATA, tags.TEARAG])


def attach_pipeline() -> Pipeline:
    """``retrieval_index`` + ``knowledge_graph`` → ``kag_retrieval_index`` (in memory), the index whose
    ``retriever("kag")`` / ``retriever("kag_concat")`` work; compose it with a pipeline that reads
    ``retrieval_index`` by remapping that input (see ``rollout_kag`` in the pipeline registry); node
    ``kg_extraction.attach_knowledge_graph``."""
    return Pipeline([
        Node(attach_knowledge_graph, ["retrieval_index", "knowledge_graph", "params:kg_extraction"],
             "kag_retrieval_index", name="attach_knowledge_graph"),
    ], namespace="kg_extraction", prefix_datasets_with_namespace=False, tags=[tags.DATA, tags.TEARAG])
