"""The one planner of both retrievers: :func:`choose` decides once how a call's queries are scored (a
:class:`.plan.Choice`). A forced strategy takes its path; under ``'auto'`` the cost model (:mod:`.cost`) is the prior
and the paths within ``EXPLORE_MARGIN`` of the least are timed on the index itself, like cuDNN's benchmark mode
(:class:`.measured.MeasuredChoice`), the runner-up re-checked every ``RECHECK_EVERY`` calls. On shards the driver
measures.
"""
import math
from typing import Callable, Dict, List, Optional

import numpy as np

from .cost import CostModel
from .measured import MeasuredChoice
from .plan import Choice, Plan, nonzero_fractions

#: Below this matrix size (bytes) the matrix sits in the caches and ``'auto'`` scores densely (BLAS is as fast).
MIN_PRUNED_BYTES = 16 * 2 ** 20
#: Paths estimated within this factor of the cheapest are timed (the model's misses so far were up to 1.6x).
EXPLORE_MARGIN = 2.0
#: Every this many calls of a bucket on its winner, the runner-up is timed once more.
RECHECK_EVERY = 64


def bucket(query_vecs: np.ndarray, k: int) -> str:
    """The bucket of a call: ``k``, the batch size rounded down to a power of two and the quarter of the mean kept
    fraction, e.g. ``'k100 n8 kept0.25-0.50'``."""
    batch = 1 << (len(query_vecs).bit_length() - 1)
    quarter = min(3, int(float(np.mean(nonzero_fractions(query_vecs))) * 4))
    return f'k{k} n{batch} kept{quarter / 4:.2f}-{(quarter + 1) / 4:.2f}'


def candidates(costs: Dict[str, float]) -> List[str]:
    """The paths within ``EXPLORE_MARGIN`` of the least estimated cost, cheapest first."""
    least = min(costs.values())
    return sorted((path for path, cost in costs.items() if cost <= EXPLORE_MARGIN * least), key=costs.get)


def auto_costs(query_vecs: np.ndarray, *, matrix_bytes: int, compiled: bool, model: Callable[[], CostModel], k: int,
               float32_ready: bool = True) -> Optional[Dict[str, float]]:
    """The estimated cost of each path ``'auto'`` may take (:meth:`.CostModel.path_costs`); None where it scores
    densely without asking (no compiled kernels, a matrix under ``MIN_PRUNED_BYTES``, no queries). Without
    ``float32_ready`` the float32 pruned paths are left out: ``'auto'`` never builds that copy."""
    if not compiled or matrix_bytes < MIN_PRUNED_BYTES or not len(query_vecs):
        return None
    costs = model().path_costs(query_vecs, k=k, matrix_bytes=matrix_bytes, one_pass=len(query_vecs) > 1)
    if not float32_ready:
        costs = {path: cost for path, cost in costs.items() if Plan(path).strategy != 'pruned'}
    return costs


def choose(query_vecs: np.ndarray, *, strategy: str, matrix_bytes: int, compiled: bool,
           model: Callable[[], CostModel], k: int, float32_ready: bool = True,
           timings: Optional[MeasuredChoice] = None) -> Choice:
    """How a call scores these pruned query vectors (n, dims), ``k`` results each: ``'dense'`` as it is;
    ``'pruned'`` / ``'compressed'`` in one pass or query after query, as ``model()`` finds cheaper; ``'auto'`` dense
    where :func:`auto_costs` is None, else the measured choice with ``timings``, the least estimate without.
    ``model`` is called only when the choice depends on it; nothing is recorded here."""
    if strategy in ('dense', 'pruned', 'compressed'):
        one_pass = {'pruned': 'one pass', 'compressed': 'compressed one pass'}.get(strategy)
        if one_pass is None or not compiled or len(query_vecs) < 2:
            return Choice(strategy, math.nan, '', 'forced')
        if matrix_bytes >= MIN_PRUNED_BYTES:
            costs = model().path_costs(query_vecs, k=k, matrix_bytes=matrix_bytes, one_pass=True)
            one_pass = one_pass if costs[one_pass] < costs[strategy] else strategy
        return Choice(one_pass, math.nan, '', 'forced')
    if strategy != 'auto':
        raise ValueError(f"unknown strategy {strategy!r}; expected 'auto', 'pruned', 'dense' or 'compressed'")
    costs = auto_costs(query_vecs, matrix_bytes=matrix_bytes, compiled=compiled, model=model, k=k,
                       float32_ready=float32_ready)
    if costs is None:
        return Choice('dense', math.nan, '', 'model')
    if timings is None:
        path = min(costs, key=costs.get)
        return Choice(path, costs[path], '', 'model')
    return measured_choice(costs, bucket(query_vecs, k), timings)


def measured_choice(costs: Dict[str, float], name: str, timings: MeasuredChoice) -> Choice:
    """The path of a call of bucket ``name`` with estimates ``costs``, by ``timings``."""
    paths = candidates(costs)
    if len(paths) == 1:
        return Choice(paths[0], costs[paths[0]], name, 'only')
    factors, calls = timings.bucket_timings(name)
    untimed = [path for path in paths if path not in factors]
    if untimed:
        return Choice(untimed[0], costs[untimed[0]], name, 'explore')
    ranking = sorted(paths, key=lambda path: costs[path] * factors[path])
    if calls and calls % RECHECK_EVERY == 0:
        return Choice(ranking[1], costs[ranking[1]], name, 'recheck')
    return Choice(ranking[0], costs[ranking[0]], name, 'measured')
