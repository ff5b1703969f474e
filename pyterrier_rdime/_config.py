"""Configuration of the package's transformers: repr, equality and hashing from their arguments, argument checks,
and the default cache folder."""
import inspect
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict, Sequence

import numpy as np
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
        shown = [f'{name}={_short_repr(value)}' for name, value in self._config().items()
                 if params[name].default is inspect.Parameter.empty or not _same(value, params[name].default)]
        return f'{type(self).__name__}({", ".join(shown)})'

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self._config(), other._config()
        return all(_same(mine[k], theirs[k]) for k in mine)

    def __hash__(self) -> int:
        return hash((type(self),) + tuple(_hashable(v) for v in self._config().values()))


_SCALARS = (str, numbers.Number, bool, type(None))


def _same(a: Any, b: Any) -> bool:
    """Scalars and mappings compare by value (an int count and a float fraction differ), on-disk indexes by path;
    other objects (encoders, arrays, qrels frames, callables) by identity."""
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return type(a) is type(b) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a is b or dict(a) == dict(b)
    if hasattr(a, 'index_path') and hasattr(b, 'index_path'):
        return type(a) is type(b) and str(a.index_path) == str(b.index_path)
    return a is b


def _hashable(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping):
        return ('mapping', len(value))
    if hasattr(value, 'index_path'):
        return ('index', str(value.index_path))
    return id(value)


def _short_repr(value: Any) -> str:
    """Data arguments (qrels, answers) as a one-line summary, so reprs stay short in messages and system names."""
    if hasattr(value, 'shape') and hasattr(value, 'columns'):
        return f'<{type(value).__name__} of {value.shape[0]} rows>'
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return f'<ndarray {value.shape[0]}x{value.shape[1]} {value.dtype}>'
    if isinstance(value, Mapping):
        return f'<{type(value).__name__} of {len(value)} items>'
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


# Argument checks shared by every stage (and the runner): each raises a ValueError that names the stage, the option,
# the value given and what is accepted. ``hint`` adds the fix where the accepted range alone does not say it.

def check_int(stage: str, name: str, value: object, minimum: int, hint: str = '') -> None:
    """An integer (not a bool) >= ``minimum``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        _fail(stage, name, f'an integer >= {minimum}', value, hint)


def check_positive(stage: str, name: str, value: object, hint: str = '') -> None:
    """A finite real number > 0."""
    if not _is_real(value) or not np.isfinite(value) or value <= 0:
        _fail(stage, name, 'a positive number', value, hint)


def check_nonnegative(stage: str, name: str, value: object, hint: str = '') -> None:
    """A finite real number >= 0."""
    if not _is_real(value) or not np.isfinite(value) or value < 0:
        _fail(stage, name, 'a non-negative number', value, hint)


def check_fraction(stage: str, name: str, value: object, hint: str = '') -> None:
    """A real number in (0, 1]."""
    if not _is_real(value) or not 0 < value <= 1:
        _fail(stage, name, 'a fraction in (0, 1]', value, hint)


def check_choice(stage: str, name: str, value: object, choices: Sequence[str], hint: str = '') -> None:
    """One of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        _fail(stage, name, f'one of {", ".join(map(repr, choices))}', value, hint)


def check_bool(stage: str, name: str, value: object, hint: str = '') -> None:
    """``True`` or ``False`` (not a truthy stand-in such as 1 or 'yes', which usually means a misplaced argument)."""
    if not isinstance(value, (bool, np.bool_)):
        _fail(stage, name, 'True or False', value, hint)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _fail(stage: str, name: str, accepted: str, value: object, hint: str) -> None:
    raise ValueError(f'{stage}: {name} must be {accepted}, got {value!r}' + (f'; {hint}' if hint else ''))


def default_cache_dir() -> Path:
    """Where indexes and generated answers are cached by default: ``$PYTERRIER_RDIME_CACHE`` if set, else
    ``$XDG_CACHE_HOME/pyterrier_rdime`` (``~/.cache/pyterrier_rdime``)."""
    if os.environ.get('PYTERRIER_RDIME_CACHE'):
        return Path(os.environ['PYTERRIER_RDIME_CACHE']).expanduser()
    return Path(os.environ.get('XDG_CACHE_HOME') or '~/.cache').expanduser() / 'pyterrier_rdime'
