"""Parameter schema of the data-preparation pipeline (``data_preparation``; see
conf/base/parameters_data_preparation.yml)."""

from __future__ import annotations

from collections import Counter

from pydantic import Field, field_validator

from prorag.config import StrictModel
from prorag.specs import PositiveInt


class DataPreparationParams(StrictModel):
    """Which files make up the questions and the corpus (paths relative to the project root)."""

    question_files: list[str] = Field(min_length=1)
    corpus_files: list[str] = Field(default_factory=list)
    max_questions_per_source: PositiveInt | None = None

    @field_validator("question_files", "corpus_files")
    @classmethod
    def _unique(cls, paths: list[str]) -> list[str]:
        repeated = [path for path, count in Counter(paths).items() if count > 1]
        if repeated:
            raise ValueError(f"listed more than once: {repeated}")
        return paths
