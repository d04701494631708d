"""Compare: every configured arm (baselines, the base agent, each trained method's latest adapter) on the same dev
questions of every dataset, with intervals, paired tests, a report and plots."""

from prorag.pipelines.compare.pipeline import create_pipeline

__all__ = ["create_pipeline"]
