# Types of the C extension (src/triemask/_native.c). Every method returns None to defer the
# call to the NumPy reference implementation, which then raises the typed error.
from typing import Any

class Kernel:
    def __init__(
        self,
        edge_offsets: Any,
        edge_tokens: Any,
        edge_dests: Any,
        dense_nodes: Any,
        dense_rows: Any,
        num_nodes: int,
        num_states: int,
        width: int,
        dense_min: int,
        /,
    ) -> None: ...
    def next(self, state: Any, token: Any, /) -> int | None: ...
    def fill(self, bitmask: Any, row: Any, state: Any, /) -> bool | None: ...
    def fill_batch(self, bitmask: Any, states: Any, rows: Any, /) -> bool | None: ...
    def next_batch(self, states: Any, tokens: Any, out: Any, /) -> bool | None: ...
    def pairs(self, states: Any, /) -> tuple[bytearray, bytearray] | None: ...
    def edges(self, node: Any, /) -> tuple[bytearray, bytearray] | None: ...
    def spell(self, node: Any, /) -> bytes | None: ...
    def cache_info(self) -> dict[str, int] | None: ...
    def cache_clear(self) -> None: ...

class MatcherCore:
    _kernel: Kernel | None
    _state: int
    _history: Any
    _tokens: list[int] | None
    def accept_token(self, token_id: int) -> bool: ...
    def fill_next_token_bitmask(self, bitmask: Any, row: int = 0) -> None: ...

class AutomatonCore:
    _kernel: Kernel | None
    def next_state(self, state: int, token_id: int) -> int: ...
    def fill_bitmask(self, bitmask: Any, states: Any, *, rows: Any = None) -> None: ...

class Tables:
    def __init__(
        self,
        dense: Any,
        dense_nodes: int,
        hash_table: Any,
        hash_shift: int,
        first_token: Any,
        has_children: Any,
        dup_offsets: Any,
        dup_tokens: Any,
        child_offsets: Any,
        node_byte: Any,
        /,
    ) -> None: ...

def match_trie(
    tables: Tables, parent: Any, byte: Any, terminal: Any, eos_ids: Any, max_edges: int = -1, /
) -> tuple[bytearray, bytearray, bytearray] | None: ...
def match_dag(
    tables: Tables,
    in_offsets: Any,
    source: Any,
    byte: Any,
    accepting: Any,
    eos_ids: Any,
    vocab_size: int,
    max_edges: int,
    max_work: int,
    mode: int,
    /,
) -> tuple[bytearray, bytearray, bytearray, bytearray] | str: ...
def dag_of_trie(
    parent: Any, byte: Any, terminal: Any, /
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray]: ...
def pattern_dag(
    program: Any, max_nfa_states: int, max_dfa_states: int, max_work: int, /
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray] | str | None: ...
def lazy_dag_layout(
    source: Any, byte: Any, dest: Any, accepting: Any, num_nodes: int, /
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray]: ...
def regex_program(pattern: str, max_count: int, /) -> bytearray | None: ...
def enable_ndarray_headers(writable: Any, readonly: Any, transposed: Any, /) -> bool: ...
def build_trie(
    flat: Any, starts: Any, want_inverse: bool, /
) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray, bytearray | None]: ...
def build_hash(keys: Any, values: Any, bits: int, /) -> bytearray: ...

class TokenTrieTables:
    def __init__(self, children: Any, node_byte: Any, token_offsets: Any, token_ids: Any, width: int, /) -> None: ...

def lazy_kernel(
    node_byte: Any,
    node_word: Any,
    child_blocks: Any,
    terminal_blocks: Any,
    terminal_values: Any,
    token_trie: TokenTrieTables,
    eos_ids: Any,
    num_nodes: int,
    num_states: int,
    width: int,
    dense_min: int,
    cache_bytes: int,
    slot_dest: Any,
    /,
) -> Kernel: ...
def checksum(data: Any, /) -> int: ...
def spelled_edges(
    parent: Any,
    byte: Any,
    edge_offsets: Any,
    edge_tokens: Any,
    edge_dests: Any,
    token_lengths: Any,
    token_offsets: Any,
    data: Any,
    terminal: Any,
    eos: Any,
    /,
) -> int: ...
def controls_in_strings(ebnf: str, /) -> bool: ...
def json_containers(node: object, /) -> tuple[list[dict[str, Any]], int]: ...
def json_cost(node: object, /) -> tuple[int, int, int, int]: ...
def json_copy(node: object, /) -> Any: ...
def json_plain(node: object, keywords: frozenset[str], unenforced: frozenset[str], min_values: int, /) -> bool: ...
def schema_without(
    node: Any, removed: frozenset[str], one: frozenset[str], lists: frozenset[str], maps: frozenset[str], /
) -> Any: ...
def split_tokens(data: Any, offsets: Any, lengths: Any, /) -> tuple[bytes | None, ...]: ...
