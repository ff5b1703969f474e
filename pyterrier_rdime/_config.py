"""The transformers' configuration (repr, equality, hash from their arguments), the argument checks (each ValueError
names the stage, the option, the value and what is accepted, and ``hint`` the fix), the cache folder and whether the
Hugging Face hub is offline."""
import contextlib
import functools
import inspect
import numbers
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import pyterrier as pt


class ConfigTransformer(pt.Transformer):
    """A transformer whose keyword-only constructor arguments, stored under their own names, are its identity: the
    repr lists the non-default ones, equal arguments make equal stages (``pt.Experiment`` shares their prefixes).
    ``verbose`` is left out of equality and the hash."""

    def __init__(self, **arguments: Any):
        """Store the (checked) constructor ``arguments`` under their own names."""
        vars(self).update(arguments)

    def _parameters(self) -> Dict[str, inspect.Parameter]:
        params = inspect.signature(type(self).__init__).parameters.items()
        return {name: p for name, p in params if name != 'self' and p.kind is not p.VAR_KEYWORD}

    def _config(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._parameters()}

    def _identity(self) -> Dict[str, Any]:
        return {name: value for name, value in self._config().items() if name != 'verbose'}

    def __repr__(self) -> str:
        params = self._parameters()
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


def check_int(stage: str, name: str, value: object, minimum: int, hint: str = '') -> None:
    """An integer (not a bool) >= ``minimum``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        reject(stage, name, f'an integer >= {minimum}', value, hint)


def check_positive(stage: str, name: str, value: object, hint: str = '') -> None:
    """A finite real number > 0."""
    if not _is_real(value) or not np.isfinite(value) or value <= 0:
        reject(stage, name, 'a positive number', value, hint)


def check_weights(stage: str, alpha: object, beta: object, positive: str, negative: str) -> None:
    """The weights of a positive and a negative feedback term (named ``positive``, ``negative``): >= 0, not both 0."""
    for name, value in (('alpha', alpha), ('beta', beta)):
        if not _is_real(value) or not np.isfinite(value) or value < 0:
            reject(stage, name, 'a non-negative number', value)
    if alpha == 0 and beta == 0:
        raise ValueError(f'{stage}: alpha and beta are both 0, so every importance would be 0 (no signal); give '
                         f'{positive} (alpha) or {negative} (beta) a positive weight')


def check_fraction(stage: str, name: str, value: object, hint: str = '') -> None:
    """A real number in (0, 1]."""
    if not _is_real(value) or not 0 < value <= 1:
        reject(stage, name, 'a fraction in (0, 1]', value, hint)


def check_choice(stage: str, name: str, value: object, choices: Sequence[str], hint: str = '') -> None:
    """One of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        reject(stage, name, f'one of {", ".join(map(repr, choices))}', value, hint)


def check_bool(stage: str, name: str, value: object, hint: str = '') -> None:
    """``True`` or ``False`` (a truthy 1 or 'yes' usually means a misplaced argument)."""
    if not isinstance(value, (bool, np.bool_)):
        reject(stage, name, 'True or False', value, hint)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def reject(stage: str, name: str, accepted: str, value: object, hint: str = '') -> None:
    """Raise ``<stage>: <name> must be <accepted>, got <value>[; <hint>]``."""
    raise ValueError(f'{stage}: {name} must be {accepted}, got {value!r}' + (f'; {hint}' if hint else ''))


def check_topk(stage: str, fraction: Optional[float], count: Optional[int]) -> None:
    """Exactly one of a ``fraction`` in (0, 1] and a ``count`` >= 1 (Top-k's size)."""
    if (fraction is None) == (count is None):
        raise ValueError(f'{stage}: give fraction= (a share of the dimensions) or count= (a number of dimensions), '
                         f'not {"both" if count is not None else "neither"}; got fraction={fraction!r}, '
                         f'count={count!r}')
    if count is not None:
        check_int(stage, 'count', count, 1, 'a number of dimensions; for a share of them use fraction=...')
    else:
        check_fraction(stage, 'fraction', fraction, 'a share of the dimensions; for a number of them use count=...')


def check_prompt(stage: str, prompt: object) -> None:
    """A ``str.format`` template with a ``{query}`` field (and no other field)."""
    if not isinstance(prompt, str):
        reject(stage, 'prompt', 'a string template with a {query} field', prompt)
    try:
        filled = prompt.format(query='\0')
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f'{stage}: prompt {prompt!r} is not a valid template ({type(e).__name__}: {e}); use one '
                         '{query} field and write {{ and }} for literal braces') from e
    if '\0' not in filled:
        raise ValueError(f'{stage}: prompt {prompt!r} has no {{query}} field')


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


def fork_guard(started: Callable[[], bool]) -> Dict[str, bool]:
    """``{'forked': False}``, set True in a child process forked once ``started()`` holds: a thread pool that ran in
    the parent (GNU OpenMP, torch's) cannot serve such a child, which must then compute on one thread."""
    guard = {'forked': False}
    if hasattr(os, 'register_at_fork'):
        os.register_at_fork(after_in_child=lambda: guard.update(forked=guard['forked'] or started()))
    return guard


@functools.lru_cache(maxsize=None)
def cpu_info(path: str = '/proc/cpuinfo') -> Dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (``model name``, ``cpu family``, ``model``, ``flags``, ...);
    empty where there is no such file."""
    fields: Dict[str, str] = {}
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            if not line.strip():
                break
            name, _, value = line.partition(':')
            fields[name.strip()] = value.strip()
    return fields
