"""Magnitude DIME: the importance of a query without feedback."""
import pyterrier as pt

from .. import maths
from .._config import check_bool
from ._base import DimeScorer


class MagnitudeDime(DimeScorer):
    """Magnitude DIME ``u = q * q``: needs no feedback.

    Input columns: ``qid, query_vec`` (a query or a result frame). Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Magnitude'}

    def __init__(self, *, keep_ranking: bool = True):
        check_bool(type(self).__name__, 'keep_ranking', keep_ranking)
        self.keep_ranking = keep_ranking

    def _validate(self, inp):
        pt.validate.columns(inp, includes=['qid', 'query_vec'], context=self)

    def _importance(self, inp, groups, query_vecs):
        return maths.magnitude_dime(query_vecs)
