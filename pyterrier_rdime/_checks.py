"""Argument checks of the stages, the maths and the runner (pure Python and numpy): each ValueError names the stage,
the option, the value and what is accepted, and ``hint`` the fix where that does not say it."""
import numbers
from typing import Optional, Sequence

import numpy as np


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


def check_weights(stage: str, alpha: object, beta: object, positive: str, negative: str) -> None:
    """The weights of a positive and a negative feedback term (named ``positive``, ``negative``): >= 0, not both 0."""
    check_nonnegative(stage, 'alpha', alpha)
    check_nonnegative(stage, 'beta', beta)
    if alpha == 0 and beta == 0:
        raise ValueError(f'{stage}: alpha and beta are both 0, so every importance would be 0 (no signal); give '
                         f'{positive} (alpha) or {negative} (beta) a positive weight')


def check_fraction(stage: str, name: str, value: object, hint: str = '') -> None:
    """A real number in (0, 1]."""
    if not _is_real(value) or not 0 < value <= 1:
        _fail(stage, name, 'a fraction in (0, 1]', value, hint)


def check_choice(stage: str, name: str, value: object, choices: Sequence[str], hint: str = '') -> None:
    """One of the strings ``choices``."""
    if not isinstance(value, str) or value not in choices:
        _fail(stage, name, f'one of {", ".join(map(repr, choices))}', value, hint)


def check_bool(stage: str, name: str, value: object, hint: str = '') -> None:
    """``True`` or ``False`` (a truthy 1 or 'yes' usually means a misplaced argument)."""
    if not isinstance(value, (bool, np.bool_)):
        _fail(stage, name, 'True or False', value, hint)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _fail(stage: str, name: str, accepted: str, value: object, hint: str) -> None:
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
        raise ValueError(f'{stage}: prompt must be a string template with a {{query}} field, got {prompt!r}')
    try:
        filled = prompt.format(query='\0')
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f'{stage}: prompt {prompt!r} is not a valid template ({type(e).__name__}: {e}); use one '
                         '{query} field and write {{ and }} for literal braces') from e
    if '\0' not in filled:
        raise ValueError(f'{stage}: prompt {prompt!r} has no {{query}} field')
