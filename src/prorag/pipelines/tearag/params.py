"""Parameter schema of the TeaRAG training pipeline (``tearag``; see conf/base/parameters_tearag.yml).

The schema is :mod:`prorag.training.tearag_params`, shared with the compare pipeline.
"""

from prorag.training.tearag_params import (
    IPDPOParams,
    QuestionMixParams,
    SftDataParams,
    TeaRAGAgent,
    TeaRAGParams,
    TeaRAGRetriever,
)

__all__ = ["IPDPOParams", "QuestionMixParams", "SftDataParams", "TeaRAGAgent", "TeaRAGParams", "TeaRAGRetriever"]
