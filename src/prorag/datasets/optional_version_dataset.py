"""A versioned dataset read as an *optional* input: a node gets what exists, and why the rest does not.

Kedro has no optional inputs: a versioned input without a version fails the run. ``compare`` evaluates every
trained adapter that exists and skips (naming why) the arms whose adapter does not, so its adapters are plain
catalog inputs (kedro-viz draws each adapter → compare edge) which the project's run-version hook
(:class:`~prorag.hooks.run_versions.RunVersionHook`) wraps in this dataset for the run: pinned like every other
input — the ``--load-versions`` pin, else the newest version saved by a *completed* run — or, when no version is usable,
loading as :class:`~prorag.tracking.missing_inputs.Missing` with the reason.

Declared in a catalog it wraps a dataset config (``dataset: {type: ..., filepath: ...}``) and loads its latest
version, or ``Missing`` when it has none.
"""

from __future__ import annotations

import copy
from pathlib import PurePosixPath
from typing import Any

from kedro.io.core import AbstractDataset, AbstractVersionedDataset, DatasetError, VersionNotFoundError

from prorag.tracking.missing_inputs import Available, Missing


def stored_versions(dataset: AbstractDataset) -> list[str]:
    """The versions a versioned dataset has stored, newest first."""
    # Kedro 1.7 has no public listing of a dataset's versions; _get_versions is its own (newest first).
    return [PurePosixPath(path).parent.name for path in dataset._get_versions()]  # type: ignore[attr-defined]


class OptionalVersionDataset(AbstractDataset[None, Available | Missing]):
    """Loads ``Available(data, version)`` from the wrapped versioned dataset (at its pinned load version, else its
    latest), or ``Missing(reason)``: when ``reason`` is given (nothing usable was found), or no version exists."""

    def __init__(self, *, dataset: AbstractVersionedDataset | dict[str, Any], reason: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        if isinstance(dataset, dict):
            if "type" not in dataset:
                raise DatasetError("OptionalVersionDataset: 'dataset' needs a dataset 'type' (and its arguments)")
            dataset = AbstractDataset.from_config("dataset", {**copy.deepcopy(dataset), "versioned": True})
        if not isinstance(dataset, AbstractVersionedDataset) or dataset._version is None:
            raise DatasetError(f"OptionalVersionDataset wraps a versioned dataset, not {type(dataset).__name__}")
        self._dataset = dataset
        self._reason = reason
        self.metadata = metadata

    @property
    def dataset(self) -> AbstractVersionedDataset:
        """The wrapped dataset."""
        return self._dataset

    def load(self) -> Available | Missing:
        if self._reason is not None:
            return Missing(self._reason)
        try:
            version = self._dataset.resolve_load_version()
            return Available(self._dataset.load(), version or "")
        except VersionNotFoundError as error:
            return Missing(f"{self._dataset._filepath} has no usable version ({error})")  # type: ignore[attr-defined]

    def _exists(self) -> bool:
        return True  # it always loads: the data, or why there is none

    def save(self, data: None) -> None:
        raise DatasetError("OptionalVersionDataset is read-only: the wrapped dataset is saved by the pipeline that "
                           "makes it")

    def _describe(self) -> dict[str, Any]:
        return {"dataset": self._dataset._describe(), "reason": self._reason}
