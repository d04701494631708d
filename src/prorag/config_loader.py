"""The project's config loader: Kedro's ``OmegaConfigLoader`` with the ``methods`` map resolved.

``config_loader["parameters"]`` — what ``context.params``, the catalog's ``params:`` datasets, the validation hook
and ``kedro run --params`` overrides all go through — returns complete method entries and stage blocks with their
retrievers (:func:`prorag.methods.resolve_parameters`), so a node reads ``params:methods.search_r1.reward`` as a
whole reward block although conf declares only what differs from the shared one.

``settings.py`` hands Kedro :data:`CONFIG_LOADER_ARGS` from here; the pipeline registry and the validation hook read
the methods map through :func:`configured_methods`, once per state of conf.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, Final

from kedro.config import OmegaConfigLoader

from prorag.methods import resolve_parameters

CONF_SOURCE: Final = "conf"
"""Kedro's default configuration folder (settings.py does not change it)."""

# Parameters are soft-merged: an env file (conf/gpu, conf/local) overrides the keys it names and keeps the rest
# of conf/base (Kedro's default, "destructive", would replace each top-level namespace wholesale).
CONFIG_LOADER_ARGS: Final[dict[str, Any]] = {
    "base_env": "base",
    "default_run_env": "local",
    "merge_strategy": {"parameters": "soft"},
}


class ProjectConfigLoader(OmegaConfigLoader):
    """``OmegaConfigLoader`` whose ``parameters`` are resolved by :func:`~prorag.methods.resolve_parameters`."""

    def __getitem__(self, key: str) -> dict[str, Any]:
        values = super().__getitem__(key)
        if key != "parameters":
            return values
        return resolve_parameters(values)


_methods_read: dict[tuple[Path, tuple[tuple[str, int, int], ...]], dict[str, dict[str, Any]]] = {}


def configured_methods(project_path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The resolved ``methods`` map of conf/base + conf/local (the envs change a method's settings, not which
    methods exist or their recipes: the validation hook checks that a run's env agrees).

    Read once per state of those folders: the validation hook and the pipeline registry of one ``kedro run`` share
    the read (a changed, added or removed file is read afresh)."""
    root = (project_path or _project_path()).resolve()
    key = (root, _conf_state(root))
    if key not in _methods_read:
        with warnings.catch_warnings():  # Kedro's own resolver-registration deprecation notices, once per loader
            warnings.simplefilter("ignore", UserWarning)
            loader = ProjectConfigLoader(conf_source=str(root / CONF_SOURCE), **CONFIG_LOADER_ARGS)
            _methods_read[key] = dict(loader["parameters"].get("methods") or {})
    return copy.deepcopy(_methods_read[key])


def _conf_state(root: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file of conf/base and conf/local with its modification time and size."""
    files = [path for env in (CONFIG_LOADER_ARGS["base_env"], CONFIG_LOADER_ARGS["default_run_env"])
             for path in sorted((root / CONF_SOURCE / env).rglob("*")) if path.is_file()]
    return tuple((str(path), (stat := path.stat()).st_mtime_ns, stat.st_size) for path in files)


def _project_path() -> Path:
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (candidate / CONF_SOURCE / "base").is_dir():
            return candidate
    raise FileNotFoundError(f"no {CONF_SOURCE}/base folder in {Path.cwd()} or the source checkout: run "
                            "kedro from the project root")
