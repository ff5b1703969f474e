"""DIME scorers: PyTerrier stages that add the per-query dimension importance ``query_dime``."""
from ._base import DimeScorer
from .active import ActiveFeedbackDime
from .eclipse import EclipseDime, LlmEclipseDime
from .kernel import FeedbackCutoff, KernelDime, PrfDime, SwcDime
from .llm import LlmDime
from .magnitude import MagnitudeDime
from .oracle import OracleDime

__all__ = ['DimeScorer', 'KernelDime', 'PrfDime', 'SwcDime', 'FeedbackCutoff', 'MagnitudeDime', 'LlmDime',
           'EclipseDime', 'LlmEclipseDime', 'OracleDime', 'ActiveFeedbackDime']
