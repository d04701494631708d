"""Custom Kedro datasets."""

from prorag.datasets.directory_dataset import DirectoryDataset
from prorag.datasets.jsonl_dataset import JSONLinesDataset
from prorag.datasets.knowledge_graph_dataset import KnowledgeGraphDataset
from prorag.datasets.optional_version_dataset import OptionalVersionDataset
from prorag.datasets.raw_files_dataset import RawFilesDataset
from prorag.datasets.report_datasets import CSVTableDataset, MarkdownDataset
from prorag.datasets.retrieval_index_dataset import RetrievalIndexDataset

__all__ = ["CSVTableDataset", "DirectoryDataset", "JSONLinesDataset", "KnowledgeGraphDataset", "MarkdownDataset",
           "OptionalVersionDataset", "RawFilesDataset", "RetrievalIndexDataset"]
