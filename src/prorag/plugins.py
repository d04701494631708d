"""Plug-ins named by dotted path in conf: ``reward: {kind: my_package.rewards:MyReward}`` or
``agent: {protocol: my_package.protocols:MyAdapter}`` loads a reward class or a protocol adapter from any package
on ``sys.path`` (``PYTHONPATH``), with no edit under ``src/`` and no registration call.

The registries (:func:`prorag.rewards.base.reward_class`, :func:`prorag.protocol.registry.adapter_factory`) accept
such a path wherever they accept a registered name; the path itself is the name, so every process that reads the
settings (a launched training rank too) imports the same object.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Final

from prorag.errors import UserError

PLUGIN_PATH: Final = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
"""``package.module:Attribute`` (the attribute may be dotted: ``module:Class.factory``)."""


class PluginError(UserError, ValueError):
    """A dotted path that does not name an importable object of the expected kind."""


def is_plugin_path(name: object) -> bool:
    """Whether ``name`` is written as a plug-in path (``package.module:Attribute``)."""
    return isinstance(name, str) and PLUGIN_PATH.match(name) is not None


def load_plugin(path: str, what: str) -> Any:
    """The object ``path`` names; ``what`` (e.g. ``"reward kind"``) names the setting in an error."""
    if not is_plugin_path(path):
        raise PluginError(f"{what} {path!r}: a plug-in is named 'package.module:Attribute'")
    module_name, attribute = path.split(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise PluginError(f"{what} {path!r}: cannot import {module_name!r} ({error}); is its package on "
                          "PYTHONPATH?") from error
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise PluginError(f"{what} {path!r}: {module_name} has no attribute {attribute!r}") from None
    return found
