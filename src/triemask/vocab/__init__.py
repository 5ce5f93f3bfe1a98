"""Vocabularies: token tables from every tokenizer family, the token-file readers and the
per-vocabulary token index. Imports ``base``."""

from .token_index import TokenIndex, TokenTrie, token_trie_of
from .vocabulary import Vocabulary

__all__ = ["TokenIndex", "TokenTrie", "Vocabulary", "token_trie_of"]
