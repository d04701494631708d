"""Training-pipeline fixtures: real MuSiQue-train and HotpotQA questions and a small index of their passages."""

from pathlib import Path

import pytest

from prorag.data import load_corpus, load_questions
from prorag.retrieval import build_retrieval_index

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    """The first 4 questions of musique_train and of hotpotqa, as records."""
    return [q.to_dict() for name in ("musique_train", "hotpotqa")
            for q in load_questions(RAW / "qa" / f"{name}.jsonl")[:4]]


@pytest.fixture(scope="module")
def index(questions):
    """A hashing-embedder index (plus BM25) over those questions' passages."""
    wanted = {pid for q in questions for pid in q.get("supporting_passage_ids", []) + q.get("context_passage_ids", [])}
    corpus = [p for p in load_corpus([RAW / "corpus" / "musique_train.jsonl", RAW / "corpus" / "hotpotqa.jsonl"])
              if p.id in wanted]
    return build_retrieval_index(corpus, "hashing:64", show_progress=False)


@pytest.fixture(scope="module")
def tiny_lora_adapter(tmp_path_factory) -> str:
    """A LoRA adapter on the tiny model whose B matrices are non-zero, so it changes what the model writes."""
    import torch
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm

    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "o_proj"],
                                                  task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    folder = tmp_path_factory.mktemp("adapter") / "sft_adapter"
    peft_model.save_pretrained(str(folder))
    return str(folder)
