"""The project's config loader: Kedro's ``OmegaConfigLoader`` with the ``methods`` map resolved.

``config_loader["parameters"]`` — what ``context.params``, the catalog's ``params:`` datasets, the validation hook
and ``kedro run --params`` overrides all go through — returns complete method entries and stage blocks with their
retrievers (:func:`prorag.methods.resolve_parameters`), so a node reads ``params:methods.search_r1.reward`` as a
whole reward block although conf declares only what differs from the shared one.
"""

from __future__ import annotations

from typing import Any

from kedro.config import OmegaConfigLoader

from prorag.methods import resolve_parameters


class ProjectConfigLoader(OmegaConfigLoader):
    """``OmegaConfigLoader`` whose ``parameters`` are resolved by :func:`~prorag.methods.resolve_parameters`."""

    def __getitem__(self, key: str) -> dict[str, Any]:
        values = super().__getitem__(key)
        if key != "parameters":
            return values
        return resolve_parameters(values)
