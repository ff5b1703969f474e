__version__ = '0.1.0'

from pyterrier_rdime import maths
from pyterrier_rdime.dime import (
    ActiveFeedbackDime,
    DimeScorer,
    EclipseDime,
    FeedbackCutoff,
    KernelDime,
    LlmDime,
    LlmEclipseDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    SwcDime,
)
from pyterrier_rdime.llm import LlmAnswers, LlmGenerator, read_answers_tsv, smollm2_gguf_path
from pyterrier_rdime.pruned import PrunedRetriever, ShardedPrunedRetriever, split_flex_index
from pyterrier_rdime.store import flex_index_complete, flex_index_problem
from pyterrier_rdime.threshold import DimensionThreshold, Rdime, SameBudget, ScoreMass, TopK, VectorScorer

__all__ = [
    'maths',
    'DimeScorer', 'KernelDime', 'PrfDime', 'SwcDime', 'LlmDime', 'MagnitudeDime', 'EclipseDime', 'OracleDime',
    'LlmEclipseDime', 'ActiveFeedbackDime', 'FeedbackCutoff',
    'DimensionThreshold', 'Rdime', 'TopK', 'ScoreMass', 'SameBudget',
    'VectorScorer', 'PrunedRetriever', 'ShardedPrunedRetriever', 'split_flex_index',
    'LlmAnswers', 'read_answers_tsv', 'LlmGenerator', 'smollm2_gguf_path',
    'flex_index_complete', 'flex_index_problem',
]
