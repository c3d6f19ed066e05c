"""Which storage backend opens a target: providers registered in code, then those of the `memshelf.stores` entry
point group, keyed by URL scheme. memshelf's own backends are entry points too (pyproject.toml names
stores/_providers.py), so nothing here names one; a plain path is a `sqlite://` target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .._plugins import Availability, PluginGroup, availability, Requirements, accepting, find_provider, provider_names

if TYPE_CHECKING:
    from .base import Store

StoreFactory = Callable[[str], "Store"]
"""Opens (creating if needed) the store a target names: a path or a URL."""

PATH_SCHEME = "sqlite"
"""The scheme of a target without "://": the embedded default takes plain file paths."""


@dataclass(frozen=True, slots=True)
class StoreProvider(Requirements):
    """What an entry point of the `memshelf.stores` group names, and what `register_store` keeps.

    open: the factory, called with the whole target ("postgresql://...", or the path for sqlite).
    requires: modules the backend needs, looked up without importing them (so the PostgreSQL driver is loaded only
        by someone who opens a postgresql:// URL).
    install: what to run when one of them is missing, e.g. "pip install 'memshelf[postgres]'".
    check_existing: optional; raises InvalidInput when the target is not an existing memshelf store, without
        creating or changing anything. `memshelf migrate` calls it on its source, because opening a store creates
        it. A backend without it is opened as it is.

    A plugin may also name a bare factory taking the target; it is then always available.
    """

    open: StoreFactory
    requires: tuple[str, ...] = ()
    install: str | None = None
    check_existing: Callable[[str], None] | None = None


_SCHEMES: dict[str, StoreProvider] = {}
"""Backends registered in code; they win over an entry point of the same scheme."""
_PLUGINS = PluginGroup("memshelf.stores", "store", ConfigError,
                       accepting(StoreProvider, "a factory taking the target"))


def register_store(scheme: str, factory: StoreFactory | StoreProvider) -> None:
    """Open targets that start with `scheme://` with `factory(target)`. Plain paths open the 'sqlite' store. A
    distribution offers a backend to every program instead through an entry point in the `memshelf.stores` group."""
    _SCHEMES[scheme.lower()] = factory if isinstance(factory, StoreProvider) else StoreProvider(factory)


def registered_schemes() -> list[str]:
    """Every scheme: registered in code or declared by an installed distribution (none is loaded)."""
    return provider_names(_SCHEMES, _PLUGINS)


def target_scheme(target: str) -> str:
    scheme, separator, _ = target.partition("://")
    return scheme.lower() if separator else PATH_SCHEME


def store_provider(scheme: str) -> StoreProvider | None:
    """The backend for a scheme, a registration in code first, then an entry point (loaded on first use)."""
    return find_provider(_SCHEMES, _PLUGINS, scheme)


def store_availability() -> list[Availability]:
    """Every storage scheme, where its backend comes from, and whether it can be used here (`memshelf providers`)."""
    return availability(registered_schemes(), _SCHEMES, _PLUGINS, store_provider,
                        lambda scheme, found: str(_needs_extras(scheme, found, found.missing()[0])))


def _usable_provider(target: str) -> tuple[str, StoreProvider]:
    scheme = target_scheme(target)
    found = store_provider(scheme)
    if found is None:
        known = ", ".join(registered_schemes()) or "none"
        raise ConfigError(
            f"no storage backend for {scheme!r} URLs (known: {known}); pass a file path for SQLite, "
            "or postgresql://... with the 'postgres' extra installed, or install a distribution that declares "
            f"{scheme!r} in the 'memshelf.stores' entry point group{_PLUGINS.missing_own_hint()}"
        )
    missing = found.missing()
    if missing:
        raise _needs_extras(scheme, found, missing[0])
    return scheme, found


def _needs_extras(scheme: str, provider: StoreProvider, module: str | None) -> ConfigError:
    install = provider.install or "install the packages it needs"
    return ConfigError(f"the {scheme} backend needs extra packages ({module} is missing): {install}")


def open_store(target: str) -> Store:
    """Open (creating if needed) the store a path or URL names, with the backend its scheme is registered to."""
    scheme, provider = _usable_provider(target)
    try:
        return provider.open(target)
    except ImportError as exc:  # a dependency the provider did not declare in `requires`
        raise _needs_extras(scheme, provider, exc.name) from exc


def check_existing_store(target: str) -> None:
    """Refuse a target that is not an existing memshelf store (InvalidInput), without creating anything, when its
    backend can tell (its `check_existing` hook); an unknown or uninstalled backend is refused as open_store
    refuses it."""
    _, provider = _usable_provider(target)
    if provider.check_existing is not None:
        provider.check_existing(target)
