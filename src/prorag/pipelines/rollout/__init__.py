"""Roll out a policy (bundled, Hugging Face, adapter or OpenAI-compatible endpoint) on the configured questions."""

from prorag.pipelines.rollout.pipeline import create_pipeline, evaluated_questions_pipeline

__all__ = ["create_pipeline", "evaluated_questions_pipeline"]
