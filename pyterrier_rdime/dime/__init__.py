"""DIME scorers: PyTerrier stages that add the per-query dimension importance ``query_dime``."""
from ._base import DimeScorer, MagnitudeDime
from .kernel import EclipseDime, FeedbackCutoff, KernelDime, PrfDime, SwcDime
from .llm import LlmDime, LlmEclipseDime
from .oracle import ActiveFeedbackDime, OracleDime

__all__ = ['DimeScorer', 'KernelDime', 'PrfDime', 'SwcDime', 'FeedbackCutoff', 'MagnitudeDime', 'LlmDime',
           'EclipseDime', 'LlmEclipseDime', 'OracleDime', 'ActiveFeedbackDime']
