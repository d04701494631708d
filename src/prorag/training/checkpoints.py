"""Checkpoints and resumption shared by the SFT and DPO trainers (GRPO keeps its own in :mod:`.trl_grpo`, same rules).

A run folder holds ``checkpoints/`` (the Trainer's ``checkpoint-<step>`` folders, every ``save_steps``), the saved
``adapter/`` and, once training finished, a ``COMPLETED`` marker. Repeating the run in the same folder resumes from
the last *complete* checkpoint (one holding ``trainer_state.json``, which the Trainer writes after the weights and
optimizer: a checkpoint cut off by a kill is skipped); a folder marked ``COMPLETED`` starts afresh. Under several
processes only the main process edits the folder, and every rank waits for it before looking for a checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

COMPLETED_MARKER: Final = "COMPLETED"
"""Written into the run folder when training finished: its checkpoints are then not resumed."""
CHECKPOINTS: Final = "checkpoints"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_arguments(save_steps: int | None, save_total_limit: int | None) -> dict[str, Any]:
    """The ``TrainingArguments`` of checkpointing: every ``save_steps`` (keeping ``save_total_limit``), or none."""
    if save_steps is None:
        return {"save_strategy": "no"}
    return {"save_strategy": "steps", "save_steps": save_steps, "save_total_limit": save_total_limit}


def last_complete_checkpoint(folder: str | Path) -> Path | None:
    """The ``checkpoint-<step>`` folder with the highest step that holds ``trainer_state.json`` (None: none)."""
    root = Path(folder)
    if not root.is_dir():
        return None
    found = sorted(((int(match.group(1)), path) for path in root.iterdir()
                    if path.is_dir() and (match := _CHECKPOINT.match(path.name))), reverse=True)
    for step, path in found:
        if (path / "trainer_state.json").is_file():
            return path
        logger.warning("skipping %s: incomplete (no trainer_state.json; the run was killed while saving step %d)",
                       path, step)
    return None


def train_resumable(trainer: Any, output: str | Path, *, resume: bool) -> Path | None:
    """``trainer.train()``, resumed from the last complete checkpoint of an unfinished run in ``output`` when
    ``resume`` (module docstring); returns the checkpoint resumed from."""
    output = Path(output)
    checkpoints = Path(trainer.args.output_dir)
    if trainer.accelerator.is_main_process:
        if (output / COMPLETED_MARKER).exists():
            logger.info("%s holds a finished run: starting afresh", output)
            shutil.rmtree(checkpoints, ignore_errors=True)
            (output / COMPLETED_MARKER).unlink()
        checkpoints.mkdir(parents=True, exist_ok=True)
    trainer.accelerator.wait_for_everyone()
    last = last_complete_checkpoint(checkpoints) if resume else None
    if last is not None:
        logger.info("resuming from %s", last)
    trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    return last


def continue_adapter(model: Any, adapter_dir: str | Path) -> Any:
    """``model`` with the PEFT adapter in ``adapter_dir`` loaded trainable, its base model recorded as the folder
    ``model`` was loaded from. The saved adapter names its base by the portable name
    (:func:`~prorag.llm.registry.make_adapter_portable`), and each PEFT save looks that name up on the hub to see
    whether the vocabulary changed: offline, a warning per save on the terminal of ``make train``. Pointed at the local
    folder, the save reads its config, and :func:`save_adapter` records the portable name again."""
    from peft import PeftModel

    from prorag.llm.upstream_warnings import upstream_deprecations

    with upstream_deprecations():  # PEFT wraps the model: transformers' is_gradient_checkpointing FutureWarning
        continued = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    local = str(getattr(model, "name_or_path", "") or "")
    if local and (Path(local) / "config.json").is_file():
        for config in continued.peft_config.values():
            config.base_model_name_or_path = local
    return continued


def save_adapter(trainer: Any, adapter_dir: str | Path, *, selected_adapters: list[str] | None = None) -> Path:
    """Save the trained PEFT adapter and its tokenizer from the main process (the state dict is gathered on every
    rank first, as ZeRO-3 / FSDP need), with its base model recorded by its portable name
    (:func:`~prorag.llm.registry.make_adapter_portable`), then mark the run folder (the adapter's parent)
    ``COMPLETED``."""
    from prorag.llm.registry import make_adapter_portable

    adapter = Path(adapter_dir)
    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped) if accelerator.num_processes > 1 else None
    if accelerator.is_main_process:
        options: dict[str, Any] = {"selected_adapters": selected_adapters} if selected_adapters else {}
        if state_dict is not None:
            options["state_dict"] = state_dict
        accelerator.unwrap_model(trainer.model).save_pretrained(str(adapter), **options)
        if getattr(trainer, "processing_class", None) is not None:  # plain PEFT loading finds the tokenizer here
            trainer.processing_class.save_pretrained(str(adapter))
        make_adapter_portable(adapter)
        (adapter.parent / COMPLETED_MARKER).write_text(json.dumps({"global_step": trainer.state.global_step}))
    accelerator.wait_for_everyone()
    return adapter
