"""Configuration-based repr, equality and hashing for the package's transformers."""
import inspect
import numbers
from typing import Any, Dict

import pyterrier as pt


class ConfigTransformer(pt.Transformer):
    """A transformer whose keyword-only constructor arguments, stored under their own names, are its identity:
    the repr lists the non-default ones, and two instances with the same arguments are equal (so that
    ``pt.Experiment`` can share common pipeline prefixes)."""

    def _config(self) -> Dict[str, Any]:
        params = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in params if name != 'self'}

    def __repr__(self) -> str:
        params = inspect.signature(type(self).__init__).parameters
        shown = [f'{name}={value!r}' for name, value in self._config().items()
                 if params[name].default is inspect.Parameter.empty or not _same(value, params[name].default)]
        return f'{type(self).__name__}({", ".join(shown)})'

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self._config(), other._config()
        return all(_same(mine[k], theirs[k]) for k in mine)

    def __hash__(self) -> int:
        return hash((type(self),) + tuple(_hashable(v) for v in self._config().values()))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (str, numbers.Number, bool, type(None))) and isinstance(b, (str, numbers.Number, bool, type(None))):
        return type(a) is type(b) and a == b
    return a is b


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, numbers.Number, bool, type(None))) else id(value)
