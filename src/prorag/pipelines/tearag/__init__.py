"""TeaRAG training (paper §4.3): SFT data from MuSiQue decompositions → SFT → IP-DPO rounds → TeaRAG rollouts."""

from prorag.pipelines.tearag.pipeline import create_pipeline

__all__ = ["create_pipeline"]
