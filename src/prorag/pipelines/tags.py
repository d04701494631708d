"""Node tags, for ``kedro run --tags ...`` and kedro-viz's tag filter.

Every node has exactly one *kind* tag; nodes that belong to one method's training also carry that *method*'s tag
(shared stages — data, indexing, base rollouts, evaluation, judging — carry none). HiPRAG and the multi-stage
method share the trained-agent stages (the ``agent`` and ``reward`` blocks pick between them), so those carry
both. Examples: ``kedro run --pipelines=train --tags=evaluation`` re-evaluates and re-judges the latest
trajectories; ``kedro run --pipelines=train_tearag --tags=tearag`` re-runs TeaRAG's own stages on the latest index.
"""

from __future__ import annotations

from typing import Final

# kinds: one per node
DATA: Final = "data"
"""Preparing questions and corpus, indexing, knowledge-graph extraction."""
ROLLOUT: Final = "rollout"
"""Rolling a policy out on the dev questions (base methods and trained policies)."""
TRAINING: Final = "training"
"""Training data (gold trajectories, MCTS pairs, TeaRAG paths) and the trainers (SFT, GRPO, DPO, IP-DPO)."""
EVALUATION: Final = "evaluation"
"""Retrieval recall, the evaluation table, reward judging."""
KINDS: Final = frozenset({DATA, ROLLOUT, TRAINING, EVALUATION})

# methods: on the nodes specific to one (or, for the shared trained agent, two) of the implemented papers
HIPRAG: Final = "hiprag"
MULTISTAGE: Final = "multistage"
REASONRAG: Final = "reasonrag"
TEARAG: Final = "tearag"
METHODS: Final = frozenset({HIPRAG, MULTISTAGE, REASONRAG, TEARAG})
TRAINED_AGENT: Final = (HIPRAG, MULTISTAGE)
"""The methods of the ``agent`` / ``reward`` blocks: SFT data synthesis, SFT, GRPO and their policies' rollouts."""
