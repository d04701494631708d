"""A read-only dataset of several versioned datasets' latest versions, each optional.

Catalog entry::

    trained_artifacts:
      type: prorag.datasets.LatestVersionsDataset
      datasets:
        sft_adapter:
          type: prorag.datasets.DirectoryDataset
          filepath: data/06_models/sft_adapter
          made_by: train_sft            # the pipeline that writes it, named when it has no version yet
        ...

Loads ``{name: {"data": <the dataset's load()>, "version": <its version>, "made_by": ...}}``, with ``data`` and
``version`` None for a dataset that has no version yet — so a node can use what has been trained and name what has
not (the compare pipeline), where a plain catalog input would fail the whole run. Kedro's own versioning finds the
latest version, through the dataset type each entry names, unless the run pinned one (:meth:`pinned`: the project's
run-version hook pins each entry to its newest version saved by a *completed* run, or to ``--load-versions``); an
entry pinned to None loads as missing, with the ``reason``.
"""

from __future__ import annotations

import copy
from pathlib import PurePosixPath
from typing import Any

from kedro.io.core import AbstractDataset, DatasetError, VersionNotFoundError


def stored_versions(dataset: AbstractDataset) -> list[str]:
    """The versions a versioned dataset has stored, newest first."""
    # Kedro 1.7 has no public listing of a dataset's versions; _get_versions is its own (newest first).
    return [PurePosixPath(path).parent.name for path in dataset._get_versions()]  # type: ignore[attr-defined]


class LatestVersionsDataset(AbstractDataset[None, dict[str, dict[str, Any]]]):
    """Loads the latest version of each configured versioned dataset, or None where there is none."""

    def __init__(self, *, datasets: dict[str, dict[str, Any]], metadata: dict[str, Any] | None = None) -> None:
        self._pins: dict[str, str | None] = {}
        self._reasons: dict[str, str] = {}
        self._entries: dict[str, tuple[dict[str, Any], str | None]] = {}
        for name, config in datasets.items():
            if not isinstance(config, dict) or "type" not in config:
                raise DatasetError(f"LatestVersionsDataset: entry {name!r} needs a dataset 'type' (and its arguments)")
            entry = copy.deepcopy(config)
            made_by = entry.pop("made_by", None)
            entry.pop("versioned", None)
            self._entries[name] = ({**entry, "versioned": True}, made_by)
        self.metadata = metadata

    @property
    def names(self) -> list[str]:
        """The entries, in catalog order."""
        return list(self._entries)

    def versions(self, name: str) -> list[str]:
        """The stored versions of entry ``name``, newest first."""
        return stored_versions(AbstractDataset.from_config(name, copy.deepcopy(self._entries[name][0])))

    def pinned(self, versions: dict[str, str | None], reasons: dict[str, str] | None = None
               ) -> LatestVersionsDataset:
        """A copy loading each named entry at the given version (None: as missing, for ``reasons[name]``)."""
        copied = copy.copy(self)
        copied._pins = {**self._pins, **versions}
        copied._reasons = {**self._reasons, **(reasons or {})}
        return copied

    def load(self) -> dict[str, dict[str, Any]]:
        loaded: dict[str, dict[str, Any]] = {}
        for name, (config, made_by) in self._entries.items():
            if name in self._pins and self._pins[name] is None:
                loaded[name] = {"data": None, "version": None, "made_by": made_by, "reason": self._reasons.get(name)}
                continue
            dataset = AbstractDataset.from_config(name, copy.deepcopy(config), load_version=self._pins.get(name))
            try:
                version = dataset.resolve_load_version()  # type: ignore[attr-defined]
                data = dataset.load()
            except VersionNotFoundError:
                version, data = None, None
            loaded[name] = {"data": data, "version": version, "made_by": made_by}
        return loaded

    def save(self, data: None) -> None:
        raise DatasetError("LatestVersionsDataset is read-only: each entry is saved by the pipeline that makes it")

    def _describe(self) -> dict[str, Any]:
        return {name: {"filepath": config.get("filepath"), "made_by": made_by}
                for name, (config, made_by) in self._entries.items()}
