"""Parameter schema of the RL pipeline (``rl``; see conf/base/parameters_rl.yml).

The model (``policy.model``), the agent's protocol and budgets (``agent``) and the reward with its judges
(``reward``) are shared specs (:mod:`prorag.specs`): the trained-policy rollouts and reward judging read the same
blocks, so what RL optimizes is what evaluation measures.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from prorag.config import StrictModel
from prorag.data.selection import QuestionPart
from prorag.specs import PositiveInt, RetrieverSpec
from prorag.training.config import GRPOSettings, TrainerBackendSettings


class RLQuestions(StrictModel):
    """Training questions: by source file stem, first N of each; evaluated questions are always excluded."""

    sources: list[str] = Field(default=["musique_train", "hotpotqa"], min_length=1)
    max_per_source: PositiveInt | None = None
    min_metadata: dict[str, float] = Field(default_factory=dict)
    """Keep only questions whose ``metadata[key]`` is a number ``>= value`` for every entry (a question without
    the field is left out), before ``max_per_source``: ``{s_pop: 10000}`` picks PopQA's popular subjects."""
    part: QuestionPart = "all"
    """``tuning``: train only on each source's tuning part, never on a question a table may report
    (:func:`prorag.data.selection.question_parts`)."""


ServerRoot = Annotated[str, Field(pattern=r"^https?://")]


class RLPolicyServer(StrictModel):
    """The vLLM server(s) (what ``trl vllm-serve`` runs) for the rollouts; TRL syncs the trained weights into each
    before every generation batch."""

    base_url: ServerRoot | list[ServerRoot]
    """A server root, e.g. ``http://127.0.0.1:8001`` (not the ``/v1`` API path), or a list of them: data-parallel
    replicas of the policy, one per GPU; each batch's groups are spread over them (a group stays on one server) and
    the weights are pushed to each (its NCCL group on ``placement.nccl_port`` + its index)."""
    model: str = Field(min_length=1)
    """The name every server serves the policy under (the ``--model`` it was started with)."""

    @field_validator("base_url")
    @classmethod
    def _distinct(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and (not value or len({url.rstrip("/") for url in value}) != len(value)):
            raise ValueError(f"base_url lists no server or one server twice: {value}")
        return value
    timeout: float = Field(default=300.0, gt=0)
    api_key_env: str | None = None
    """The NAME of the environment variable holding the server's key; null: a keyless server (trl vllm-serve)."""


class RLParams(StrictModel):
    """``rl`` parameters."""

    questions: RLQuestions = RLQuestions()
    init: Literal["sft", "instruct"] = "sft"
    """Start from the SFT policy (the embedded default: SmolLM2 cannot follow the format without SFT) or from the
    instruct model itself, as HiPRAG trains (conf/gpu)."""
    lora: bool = True
    """Train a LoRA adapter (true) or every parameter, as the paper (false; the saved policy is then a full model
    folder, which the RL-policy rollouts load as the model)."""
    trainer: GRPOSettings = GRPOSettings()
    """prorag's GRPO settings, which every trainer backend honours (TRL ``GRPOConfig`` names;
    :class:`prorag.training.config.GRPOSettings`)."""
    backend: TrainerBackendSettings = TrainerBackendSettings()
    """The trainer backend (``trl``: TRL's GRPOTrainer; ``torch``: plain PyTorch, one process) and its own settings
    (``args``, passed through; :mod:`prorag.training.backends`)."""
    retriever: RetrieverSpec = RetrieverSpec()
    generation_batch_size: PositiveInt = 8
    judge_for_metrics: bool = False
    """Also detect over-/under-search when the reward does not need it (OSR/USR curves)."""
    policy_server: RLPolicyServer | None = None
    """None: roll out in-process with the trainer's policy (CPU, small models); set: TRL's vLLM server mode."""
    run_root: str = "data/06_models/rl_runs"
    """Checkpoints live in ``<run_root>/<fingerprint of the settings>``: an interrupted run resumes there."""
