"""The transformers' configuration (repr, equality, hash from their arguments), the argument checks, the cache folder
and whether the Hugging Face hub is offline."""
import inspect
import numbers
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pyterrier as pt

# the checks live in the pure module, which maths imports too
from ._checks import (
    check_bool,
    check_choice,
    check_fraction,
    check_int,
    check_nonnegative,
    check_positive,
    check_prompt,
    check_topk,
    check_weights,
)

__all__ = ['ConfigTransformer', 'default_cache_dir', 'hub_offline', 'check_bool', 'check_choice', 'check_fraction',
           'check_int', 'check_nonnegative', 'check_positive', 'check_prompt', 'check_topk', 'check_weights']


class ConfigTransformer(pt.Transformer):
    """A transformer whose keyword-only constructor arguments, stored under their own names, are its identity: the
    repr lists the non-default ones, equal arguments make equal stages (``pt.Experiment`` shares their prefixes).
    ``verbose`` is left out of equality and the hash."""

    def _config(self) -> Dict[str, Any]:
        params = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in params if name != 'self'}

    def _identity(self) -> Dict[str, Any]:
        return {name: value for name, value in self._config().items() if name != 'verbose'}

    def __repr__(self) -> str:
        params = inspect.signature(type(self).__init__).parameters
        shown = [f'{name}={_short_repr(value)}' for name, value in self._config().items()
                 if params[name].default is inspect.Parameter.empty or not _same(value, params[name].default)]
        return f'{type(self).__name__}({", ".join(shown)})'

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        mine, theirs = self._identity(), other._identity()
        return all(_same(mine[k], theirs[k]) for k in mine)

    def __hash__(self) -> int:
        return hash((type(self),) + tuple(_hashable(v) for v in self._identity().values()))


_SCALARS = (str, numbers.Number, bool, type(None))


def _same(a: Any, b: Any) -> bool:
    """Scalars (of one type) and mappings by value, indexes by path, other objects by identity."""
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
    """Data arguments (qrels, answers, arrays) as a one-line summary, so reprs stay short."""
    if hasattr(value, 'shape') and hasattr(value, 'columns'):
        return f'<{type(value).__name__} of {value.shape[0]} rows>'
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return f'<ndarray {value.shape[0]}x{value.shape[1]} {value.dtype}>'
    if isinstance(value, Mapping):
        return f'<{type(value).__name__} of {len(value)} items>'
    if isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):  # the array shards of an index
        text = '[' + ', '.join(_short_repr(v) for v in value) + ']'
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


def default_cache_dir() -> Path:
    """``$PYTERRIER_RDIME_CACHE``, else ``$XDG_CACHE_HOME/pyterrier_rdime`` (``~/.cache/pyterrier_rdime``)."""
    if os.environ.get('PYTERRIER_RDIME_CACHE'):
        return Path(os.environ['PYTERRIER_RDIME_CACHE']).expanduser()
    return Path(os.environ.get('XDG_CACHE_HOME') or '~/.cache').expanduser() / 'pyterrier_rdime'


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) true as huggingface_hub reads it, or the hub not answering
    within 3 seconds (rather than after a minute of retries)."""
    flag = os.environ.get('HF_HUB_OFFLINE') or os.environ.get('TRANSFORMERS_OFFLINE') or ''
    return flag.upper() in ('1', 'ON', 'YES', 'TRUE') or not _hub_reachable()


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(('huggingface.co', 443), timeout=timeout):
            return True
    except OSError:
        return False
