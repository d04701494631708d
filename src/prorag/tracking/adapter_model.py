"""LoRA adapters as MLflow models: the PEFT adapter files plus the policy's *model spec*, loaded through prorag.

Why a pyfunc model and not ``mlflow.transformers.log_model``: MLflow 3.17's transformers flavor supports PEFT, but
it saves the adapter with a reference to the base model that is either a Hugging Face repo id (taken from
``model.name_or_path``) or a local folder (``base_model_path``). prorag's policies are registry specs such as
``bundled:smollm2-135m-instruct``, whose weights live in a cache folder of one machine
(``$PRORAG_CACHE_DIR/models/...``): that path is not a valid repo id, so the flavor would either copy the whole
base model into every adapter's artifacts or write a path that exists on one machine only. The pyfunc model
below stores the adapter folder as an artifact and the spec string in its ``model_config``; loading resolves the
spec through :mod:`prorag.llm.registry` (building a bundled model on first use, offline) and merges the adapter,
so ``mlflow.pyfunc.load_model("models:/prorag-sft_adapter/1")`` works wherever prorag is installed.

With ``tracking.model_flavor: transformers`` the hook logs instead the policy with the adapter merged in, in the
transformers flavour itself (:func:`log_merged_model`): the whole model's weights, loadable without prorag.

The model is logged from code (:mod:`prorag.tracking.adapter_model_code`, no pickle). Loading needs prorag
importable and the base model resolvable there: a bundled spec, a Hugging Face name in the local cache (or
``PRORAG_ALLOW_DOWNLOAD=1``), or a local folder. Loading executes the code file stored in the model's artifacts
(as any MLflow model logged from code does): load only models from an artifact store whose writers are trusted
(``docs/tracking.md``).
"""

from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import mlflow
import pandas as pd
from mlflow.models import Model, ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema

from prorag.config import MixedPrecision

ADAPTER_ARTIFACT: Final = "adapter"
"""The artifact key (and folder) of the PEFT adapter inside the logged model."""
MODEL_CODE: Final = Path(__file__).with_name("adapter_model_code.py")
"""The model's code (MLflow "models from code": no pickle), which wraps :class:`PeftAdapterModel`."""
DEFAULT_MAX_NEW_TOKENS: Final = 64
_REQUIREMENTS: Final = ("mlflow", "torch", "transformers", "peft", "accelerate")


class PeftAdapterModel(mlflow.pyfunc.PythonModel):
    """A policy = base model spec + LoRA adapter, generating text for prompts.

    ``predict`` takes a list of prompts (or a one-column DataFrame) and returns one completion per prompt.
    Params: ``max_new_tokens`` (default 64), ``temperature`` (0: greedy), ``chat`` (True: each prompt is a user
    message rendered with the model's chat template; False: the prompt is raw text). After loading,
    ``unwrap_python_model().generator`` is a prorag :class:`~prorag.llm.generation.Generator` (e.g. for the
    rollout engine).
    """

    def __init__(self) -> None:
        self.generator: Any = None

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        from prorag.llm.factory import build_generator

        config = context.model_config or {}
        self.generator = build_generator(str(config["base_model"]), adapter=context.artifacts[ADAPTER_ARTIFACT],
                                         dtype=str(config.get("dtype", "float32")),
                                         mixed_precision=config.get("mixed_precision", "no"),
                                         batch_size=int(config.get("batch_size", 8)))

    # model_input is hinted as a DataFrame: MLflow keeps the logged signature (a list[str] hint would replace it and
    # drop the params) and turns a list of prompts into a one-column frame
    def predict(self, context: mlflow.pyfunc.PythonModelContext, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[str]:
        from prorag.llm.generation import SamplingParams

        params = params or {}
        prompts = _prompts(model_input)
        if params.get("chat", True):
            prompts = [self.generator.apply_chat_template([{"role": "user", "content": prompt}])
                       for prompt in prompts]
        sampling = SamplingParams(max_new_tokens=int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
                                  temperature=float(params.get("temperature", 0.0)))
        return [samples[0].text for samples in self.generator.generate(prompts, sampling)]


def _prompts(model_input: Any) -> list[str]:
    """Prompts from a DataFrame (its ``prompt`` column, else its first), a list of strings or a string."""
    if isinstance(model_input, str):
        return [model_input]
    columns = getattr(model_input, "columns", None)
    if columns is not None:
        column = "prompt" if "prompt" in columns else columns[0]
        return [str(value) for value in model_input[column].tolist()]
    return [str(value) for value in model_input]


def adapter_signature() -> ModelSignature:
    """A prompt (string) in, one string out; the generation params with their defaults."""
    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema([ColSpec(DataType.string)]),
        params=ParamSchema([ParamSpec("max_new_tokens", DataType.long, DEFAULT_MAX_NEW_TOKENS),
                            ParamSpec("temperature", DataType.double, 0.0),
                            ParamSpec("chat", DataType.boolean, True)]))


def _pinned_requirements() -> list[str]:
    """The installed versions of what loading needs (explicit: MLflow's inference would load the model).

    prorag itself is not listed: it is not a PyPI package (a same-named upload would be someone else's code)."""
    pinned = []
    for name in _REQUIREMENTS:
        try:
            pinned.append(f"{name}=={version(name).split('+')[0]}")
        except PackageNotFoundError:
            continue
    return pinned


def log_adapter_model(adapter_dir: str | Path, *, base_model: str, run_id: str, name: str,
                      dtype: str = "float32", mixed_precision: MixedPrecision | None = "no",
                      registered_model_name: str | None = None, tags: dict[str, str] | None = None) -> ModelInfo:
    """Log the PEFT adapter in ``adapter_dir`` as a :class:`PeftAdapterModel` named ``name`` in run ``run_id``,
    with ``base_model`` (a registry spec or Hugging Face name) as its base; registered as
    ``registered_model_name`` when given (a new version each time). ``dtype`` and ``mixed_precision`` are the
    policy's (``policy.dtype``, ``policy.mixed_precision``; None or YAML's bare ``no``, false: ``"no"``): the loaded
    model generates as the evaluated one did."""
    with warnings.catch_warnings():  # no input example: MLflow would load the base model to try it
        warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
        return Model.log(
            artifact_path=None, name=name, flavor=mlflow.pyfunc, run_id=run_id, python_model=str(MODEL_CODE),
            artifacts={ADAPTER_ARTIFACT: str(adapter_dir)},
            model_config={"base_model": base_model, "dtype": dtype, "mixed_precision": mixed_precision or "no"},
            signature=adapter_signature(), pip_requirements=_pinned_requirements(),
            registered_model_name=registered_model_name, await_registration_for=0,
            metadata={"base_model": base_model, "adapter": "peft"}, tags=tags)


def log_merged_model(adapter_dir: str | Path, *, base_model: str, run_id: str, name: str, dtype: str = "float32",
                     max_mb: float | None = None, registered_model_name: str | None = None,
                     tags: dict[str, str] | None = None) -> ModelInfo | None:
    """Log ``base_model`` with the PEFT adapter in ``adapter_dir`` merged in, in MLflow's transformers flavour
    (text generation), as ``name`` in run ``run_id``: loadable with ``mlflow.transformers.load_model`` or
    ``mlflow.pyfunc.load_model`` (param ``max_new_tokens``) where mlflow and transformers are installed, prorag or
    not. None when its weights are larger than ``max_mb`` (nothing logged)."""
    import mlflow.transformers
    from mlflow.models import infer_signature

    from prorag.llm.registry import merged_policy

    model, tokenizer = merged_policy(base_model, adapter_dir, dtype)
    size_mb = sum(tensor.numel() * tensor.element_size() for tensor in model.state_dict().values()) / 1e6
    if max_mb is not None and size_mb > max_mb:
        return None
    # a components dict, not a saved folder: MLflow 3.17 reads a folder's task with transformers 4's task table
    with warnings.catch_warnings():  # no input example: MLflow would run the model to try it
        warnings.filterwarnings("ignore", message=".*input example was not provided", category=UserWarning)
        return mlflow.transformers.log_model(
            {"model": model, "tokenizer": tokenizer}, name=name, task="text-generation", run_id=run_id,
            signature=infer_signature("a prompt", "a completion", params={"max_new_tokens": DEFAULT_MAX_NEW_TOKENS}),
            pip_requirements=[requirement for requirement in _pinned_requirements()
                              if not requirement.startswith("peft")],
            registered_model_name=registered_model_name, await_registration_for=0,
            metadata={"base_model": str(model.config.name_or_path), "adapter": "merged"}, tags=tags)
