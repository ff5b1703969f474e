"""LLM answers for LLM DIME: read from a file (:class:`LlmAnswers`) or generated (:class:`LlmGenerator`)."""
from ._hf import smollm2_gguf_path
from .answers import LlmAnswers, read_answers_tsv
from .generator import LlmGenerator

__all__ = ['LlmAnswers', 'read_answers_tsv', 'LlmGenerator', 'smollm2_gguf_path']
