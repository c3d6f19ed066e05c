"""Providers found through entry points, the way llm and sqlite-utils find their plugins.

A distribution offers a provider by naming an object in its metadata, e.g. in its pyproject.toml:

    [project.entry-points."memshelf.embedders"]
    hash = "memshelf_hash:provider"

memshelf's own providers are declared the same way in its pyproject.toml, so the core names none of them. The
entry points of a group are read once, on its first use (one scan of the installed metadata), and an entry point
is imported only when its name is asked for. A name registered in code (`register_embedder`, `register_store`)
wins over an entry point of the same name; that choice is the registries', which keep their own tables.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .errors import MemshelfError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

T = TypeVar("T")

OWN_DISTRIBUTION = "memshelf"


@dataclass(frozen=True, slots=True)
class Plugin:
    """One entry point of a memshelf group, before it is loaded."""

    group: str
    name: str
    value: str  # "module:attribute"
    project: str | None  # the distribution's name, None when the metadata does not say
    version: str | None

    @classmethod
    def of(cls, point: EntryPoint) -> Plugin:
        dist = point.dist
        if dist is None:
            return cls(point.group, point.name.lower(), point.value, None, None)
        return cls(point.group, point.name.lower(), point.value, dist.name, dist.version)

    @property
    def distribution(self) -> str:
        return f"{self.project} {self.version}" if self.project else "an unknown distribution"

    @property
    def own(self) -> bool:
        """Declared by memshelf itself (a built-in provider)."""
        return (self.project or "").lower() == OWN_DISTRIBUTION


def missing_modules(requires: Sequence[str]) -> list[str]:
    """The modules of `requires` that are not installed, looked up without importing them (a provider's
    availability must stay cheap to ask: asking about the local model never loads torch)."""
    return [name for name in requires if not _installed(name)]


class Requirements:
    """What a provider needs installed (`requires`: modules it imports when used) and whether it has it. Mixed into
    each kind's provider record (EmbedderProvider, StoreProvider, ExtractorProvider)."""

    __slots__ = ()
    requires: tuple[str, ...]

    def missing(self) -> list[str]:
        """The required modules that are not installed."""
        return missing_modules(self.requires)

    @property
    def available(self) -> bool:
        return not self.missing()


P = TypeVar("P")


def accepting(provider: type[P], bare: str) -> Callable[[object], P]:
    """How a group turns what an entry point names into its provider record: the record itself, or a bare factory
    (`bare` says what it takes), wrapped as `provider(factory)`."""
    def accept(loaded: object) -> P:
        if isinstance(loaded, provider):
            return loaded
        if callable(loaded):
            return provider(loaded)  # type: ignore[call-arg]  # each record takes its factory first
        article = "an" if provider.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"expected {article} {provider.__name__} or {bare}, got {type(loaded).__name__}")
    return accept


def provider_names(in_code: Mapping[str, object], group: PluginGroup[Any]) -> list[str]:
    """Every name of a kind: registered in code or declared by an installed distribution (none is loaded)."""
    return sorted(set(in_code) | set(group.names()))


def find_provider(in_code: Mapping[str, P], group: PluginGroup[P], name: str) -> P | None:
    """The provider of that name: a registration in code first, then an entry point (loaded on first use)."""
    key = name.lower()
    return in_code.get(key) or group.get(key)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False


@dataclass(frozen=True, slots=True)
class Availability:
    """What `memshelf providers` says about one provider name."""

    name: str
    origin: str  # the distribution that declares it ("memshelf 0.1.0"), or "registered in code"
    available: bool
    problem: str | None = None  # what is missing and how to install it, or why the plugin failed to load



R = TypeVar("R", bound=Requirements)


def availability(names: Sequence[str], in_code: Mapping[str, object], group: PluginGroup[R],
                 find: Callable[[str], R | None], problem: Callable[[str, R], str]) -> list[Availability]:
    """What `memshelf providers` lists for one kind: each name, where it comes from, and whether it can be used here.
    A plugin that fails to load is reported, not raised; `problem(name, provider)` words what is missing when a
    provider's requirements are not installed."""
    listed = []
    for name in names:
        origin = "registered in code" if name in in_code else group.origin(name)
        try:
            found = find(name)
        except group.error as exc:
            listed.append(Availability(name, origin, False, str(exc)))
            continue
        if found is None or found.available:
            listed.append(Availability(name, origin, found is not None))
        else:
            listed.append(Availability(name, origin, False, problem(name, found)))
    return listed

_lock = threading.Lock()
_points: dict[str, dict[str, EntryPoint]] = {}
_groups: list[PluginGroup[Any]] = []


def _group_points(group: str) -> dict[str, EntryPoint]:
    """The group's entry points by lowercased name, read from the installed metadata once. The first distribution
    on sys.path that declares a name keeps it, as the import system would."""
    with _lock:
        found = _points.get(group)
        if found is None:
            from importlib.metadata import entry_points  # not at import time: `import memshelf` stays light

            found = {}
            for point in entry_points(group=group):
                found.setdefault(point.name.lower(), point)
            _points[group] = found
        return found


def rescan() -> None:
    """Forget what was discovered and loaded, so the next use reads the installed metadata again (after a plugin
    is installed in a running process, and in tests)."""
    with _lock:
        _points.clear()
    for group in _groups:
        group.forget()


class PluginGroup(Generic[T]):
    """The providers of one entry point group: their names (no import), and each provider loaded on demand.

    `accept(loaded)` turns the object an entry point names into the group's provider type, or raises TypeError
    saying what was expected. Loading failures of every kind become `error`, naming the plugin and the
    distribution that declared it, with the original exception chained.
    """

    def __init__(self, group: str, kind: str, error: type[MemshelfError],
                 accept: Callable[[object], T]) -> None:
        self.group, self.kind, self.error, self._accept = group, kind, error, accept
        self._loaded: dict[str, T] = {}
        self._lock = threading.Lock()
        _groups.append(self)

    def plugins(self) -> list[Plugin]:
        return [Plugin.of(point) for _, point in sorted(_group_points(self.group).items())]

    def names(self) -> list[str]:
        return sorted(_group_points(self.group))

    def plugin(self, name: str) -> Plugin | None:
        point = _group_points(self.group).get(name.lower())
        return None if point is None else Plugin.of(point)

    def origin(self, name: str) -> str:
        plugin = self.plugin(name)
        return plugin.distribution if plugin is not None else "registered in code"

    def get(self, name: str) -> T | None:
        """The provider an entry point of this name declares, loaded and cached; None when there is none."""
        key = name.lower()
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
        point = _group_points(self.group).get(key)
        if point is None:
            return None
        provider = self._load(point)
        with self._lock:
            return self._loaded.setdefault(key, provider)

    def forget(self) -> None:
        with self._lock:
            self._loaded.clear()

    def _load(self, point: EntryPoint) -> T:
        plugin = Plugin.of(point)
        try:
            loaded = point.load()
        # A plugin's module may fail to import in any way (a missing dependency, a syntax error, an exception in
        # its top-level code); each becomes one error naming the plugin, with the cause chained, never a bare
        # traceback from the middle of discovery.
        except Exception as exc:
            raise self.error(
                f"the {self.kind} plugin {plugin.name!r} ({plugin.value}, from {plugin.distribution}) failed to "
                f"load: {type(exc).__name__}: {exc}. Fix or reinstall that distribution, or uninstall it"
                + (f" (pip uninstall {plugin.project})" if plugin.project else "")) from exc
        try:
            return self._accept(loaded)
        except TypeError as exc:
            raise self.error(
                f"the {self.kind} plugin {plugin.name!r} ({plugin.value}, from {plugin.distribution}) does not name "
                f"a provider of the {self.group!r} entry point group: {exc}") from exc

    def missing_own_hint(self) -> str:
        """A sentence for 'not found' messages when memshelf's own metadata declares nothing in this group, which
        happens when the package runs from a source tree that was never installed."""
        if any(plugin.own for plugin in self.plugins()):
            return ""
        return (f" (memshelf's own {self.kind} providers are declared in its package metadata, and none was found:"
                " install memshelf, e.g. `pip install -e .` in a source checkout)")
