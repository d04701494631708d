"""RL: GRPO over multi-turn rollouts with the HiPRAG process reward (or a baseline / ablation reward)."""

from prorag.pipelines.rl.pipeline import create_pipeline

__all__ = ["create_pipeline"]
