"""LLM answers for LLM DIME: read from a file (:class:`LlmAnswers`), published by name (:meth:`LlmAnswers.published`)
or generated (:class:`LlmGenerator`)."""
from .answers import LlmAnswers, read_answers_csv, read_answers_tsv
from .generator import LlmGenerator, smollm2_gguf_path

__all__ = ['LlmAnswers', 'read_answers_tsv', 'read_answers_csv', 'LlmGenerator', 'smollm2_gguf_path']
