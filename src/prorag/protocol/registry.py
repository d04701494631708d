"""Protocols by name: the built-in ones are listed here once; a user's protocol is added with
:func:`register_protocol` (no engine, SFT or judging code changes).

``get_protocol("hiprag", few_shot=False)`` builds an adapter; options a protocol does not take are an error
naming the protocol.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final

from prorag.errors import UserError
from prorag.plugins import PluginError, is_plugin_path, load_plugin
from prorag.protocol.base import ProtocolAdapter

AdapterFactory = Callable[..., ProtocolAdapter]

# The built-in protocols, imported on first use: "module:attribute" of each adapter class.
_BUILTIN: Final[dict[str, str]] = {
    "hiprag": "prorag.protocol.hiprag:HiPRAGAdapter",
    "search_r1": "prorag.protocol.search_r1:SearchR1Adapter",
    "multistage": "prorag.protocol.multistage:MultistageAdapter",
    "reasonrag": "prorag.protocol.reasonrag:ReasonRAGAdapter",
    "tearag": "prorag.protocol.tearag:TeaRAGAdapter",
}

_registered: dict[str, AdapterFactory] = {}


class UnknownProtocolError(UserError, ValueError):
    """A protocol name that is neither built in nor registered."""


def register_protocol(name: str, factory: AdapterFactory, *, replace: bool = False) -> None:
    """Make ``factory`` (an adapter class or a function returning an adapter) available as ``name``."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a protocol name must be a non-empty string, got {name!r}")
    if not replace and (name in _registered or name in _BUILTIN):
        raise ValueError(f"protocol {name!r} is already registered (pass replace=True to override it)")
    _registered[name] = factory


def unregister_protocol(name: str) -> None:
    """Remove a protocol added with :func:`register_protocol` (built-ins stay)."""
    _registered.pop(name, None)


def protocol_names() -> list[str]:
    """Every protocol name that :func:`get_protocol` accepts."""
    return sorted({*_BUILTIN, *_registered})


def is_protocol(name: str) -> bool:
    """Whether ``name`` is a protocol: registered, built in, or an adapter's importable dotted path."""
    if name in _registered or name in _BUILTIN:
        return True
    try:
        return is_plugin_path(name) and adapter_factory(name) is not None
    except PluginError:
        return False


def adapter_factory(name: str) -> AdapterFactory:
    """The class or function that builds the adapter of ``name``."""
    if name in _registered:
        return _registered[name]
    target = _BUILTIN.get(name)
    if target is None and is_plugin_path(name):
        found = load_plugin(name, "protocol")
        if not callable(found):
            raise PluginError(f"protocol {name!r} names {found!r}, not an adapter class or factory")
        return found
    if target is None:
        raise UnknownProtocolError(f"unknown protocol {name!r} (known: {', '.join(protocol_names())}, or an "
                                   "adapter of your own as 'package.module:Class')")
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


def get_protocol(protocol: str | ProtocolAdapter, **options: Any) -> ProtocolAdapter:
    """The adapter for a protocol name, built with ``options``; an adapter instance passes through."""
    if not isinstance(protocol, str):
        if options:
            raise ValueError(f"options {sorted(options)} given with an adapter instance")
        return protocol
    factory = adapter_factory(protocol)
    accepted = inspect.signature(factory).parameters
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in accepted.values())
    unknown = [key for key in options if key not in accepted and not takes_any]
    if unknown:
        raise ValueError(f"protocol {protocol!r} takes no option(s) {unknown} (it takes {sorted(accepted)})")
    return factory(**options)


def build_adapter(protocol: str | ProtocolAdapter, **options: Any) -> ProtocolAdapter:
    """Like :func:`get_protocol`, but each option goes only to a protocol that takes it (``few_shot``,
    ``open_next_step`` ...), so one agent spec serves every protocol; an adapter instance passes through."""
    if not isinstance(protocol, str):
        return protocol
    accepted = inspect.signature(adapter_factory(protocol)).parameters
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in accepted.values())
    return get_protocol(protocol, **{key: value for key, value in options.items() if takes_any or key in accepted})
