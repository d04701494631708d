"""DPO (TRL ``DPOTrainer`` + LoRA) on preference pairs: the project's one preference trainer."""

from prorag.pipelines.dpo.pipeline import create_pipeline

__all__ = ["create_pipeline"]
