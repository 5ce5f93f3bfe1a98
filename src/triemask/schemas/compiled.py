"""Mixed schemas: enum fields in tries, the JSON structure in xgrammar.

Design (docs/design.md, "Mixed schemas"). Each enum site of the schema is replaced
by a const placeholder; xgrammar builds the structural grammar, and in xgrammar's own
expression arrays the placeholder's literal is swapped for a *sentinel*: byte ``0xFF``
followed by bytes naming the field. ``0xFF`` is not UTF-8: xgrammar's character classes
and regexes match only UTF-8 (a free string's ``[^"\\\r\n]`` included), and its EBNF
literals are code points spelled in UTF-8, so no text the structure's language holds can
contain it and the sentinel is accepted exactly where a field's value goes
(:func:`check_entry_unforgeable` checks the installed xgrammar once per process). Where
no string or literal of the grammar admits a raw control character (most schemas), the
sentinel begins with byte ``0x01`` instead, which no text of that language holds either
and which xgrammar's EBNF spells: the grammar compiles from its text through xgrammar's
caches (:data:`~.structure.CONTROL_SENTINEL_LEAD`).

A decoding state is a small set of *configurations*, usually one:

* ``STRUCT``: an xgrammar matcher in the structural grammar;
* ``ENUM(k, node)``: a node of trie ``k``, and the xgrammar matcher just past
  sentinel ``k`` (it does not move while the value is spelled, and is where the
  structure resumes when the value ends).

Matchers are never modified once in a configuration (every step forks; probes
roll back), so configurations, rollback history and copies share them freely.

A token may span structure and enum bytes (``": "get``, ``_user",``, ``"a", "b``).
It is cut at the places a value can start (a byte a value of the site starts with,
after structural bytes ending in ``:``, ``,``, ``[`` or whitespace) and end (a value's
last byte followed by ``,``, ``}``, ``]`` or whitespace). The pieces (the part after
a start, the part before an end, the part between) are matched against each trie
at compile time, by the same linear pass as whole tokens, so at run time:

* the mask of ``STRUCT`` is xgrammar's, plus the tokens entering an enum after a
  structural prefix ``p``. xgrammar's vocabulary carries one extra token ``p + 0xFF``
  (or ``p + 0x01``: one vocabulary per lead) per such prefix, so the same mask fill says
  which prefixes an enum can follow; those are confirmed per site with ``accept_string(p + sentinel)``;
* the mask of ``ENUM`` is the trie's, plus the tokens that complete the value and go
  on (checked with the structural grammar after the sentinel);
* when a configuration is ambiguous (a union of an enum and a free string), every
  reading is kept, so the masks are those of the whole schema's language.

Outputs are strict JSON (RFC 8259) in UTF-8: where xgrammar's language is looser (raw
control characters in length-bounded strings, the UTF-8 bytes of surrogates), a JSON lexer
state kept per output removes the tokens that would break it (:class:`Lexical`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from importlib.metadata import version
from typing import Any, cast

import numpy.typing as npt

from ..automata import native_kernel
from ..base import (
    ArgumentTypeError,
    AutomatonFileError,
    BoundedLRU,
    SchemaError,
    StateError,
    TriemaskError,
    UnenforcedSchemaWarning,
    kind_class,
    kinds_of,
    register_kind,
    storage,
)
from ..sets import SetCompiler
from ..vocab import Vocabulary
from .engine import EXIT_ROWS_BYTES, KEPT_AFTER_BYTES, SchemaEngine
from .fields import (
    Field,
    SchemaOptions,
    array_text,
    compile_field,
    entry_tables,
    exit_tables,
    field_sentinels,
    field_tables,
    restore_field,
    schema_fingerprint,
    step_flags,
    text_array,
)
from .reading import UnionChoice, dispatch, json_texts, load_schema, structure_text, union_values
from .structure import (
    CONTROL_SENTINEL_LEAD,
    SENTINEL_LEAD,
    SENTINEL_LEADS,
    Configuration,
    controls_in_strings,
    field_sentinel,
    plain_strings,
)
from .support import Skeleton, require_xgrammar, vocabulary_support

DEFAULT_CHOICE_CACHE_BYTES = 256 << 20
"""Bytes of compiled choices a schema's discriminated unions keep (each the schema with one
branch chosen, compiled when first chosen); the least recently used go first."""


class CompiledSchema(SchemaEngine):
    """A JSON schema compiled for one vocabulary: enum fields as tries, the rest in xgrammar.

    Immutable and shareable across threads and requests; follow one output with
    ``triemask.Matcher(compiled_schema)``. Built by :meth:`Compiler.compile_json_schema`
    and :meth:`Compiler.compile_tools`; :meth:`save` writes it to a file (triemask's format)
    and :meth:`load` maps it back in another process.
    """

    def __init__(
        self,
        compiler: SetCompiler,
        schema: Any,
        options: SchemaOptions = SchemaOptions(),  # noqa: B008 (immutable)
        *,
        owned: bool = False,
    ) -> None:
        """``owned``: ``schema`` is already a loaded copy that nothing modifies (a union's
        choice, made from this module's own copy), taken as it is instead of copied again."""
        require_xgrammar()
        import xgrammar

        started = time.perf_counter()
        self._options = options
        self._schema = schema if owned else load_schema(schema)
        structural, sites, self._unenforced = dispatch(
            self._schema, options.min_enum_values, min_union_branches=options.min_union_branches
        )
        self._admit_unenforced(options.unsupported)
        self._vocab = compiler.vocab
        support = vocabulary_support(self._vocab)
        self._support = support
        # one trie per distinct value set, one sentinel per trie
        by_values: dict[Any, int] = {}
        numbers = []
        for site in sites:  # 1 and True are distinct values; a pattern, a union is its own key
            key: Any = (tuple(map(type, site.values)), site.values)
            if site.pattern is not None or site.union is not None:
                key = ("pattern", site.pattern) if site.union is None else ("union", site.placeholder)
            numbers.append(by_values.setdefault(key, len(by_values)))
        width = max(1, (len(sites).bit_length() + 3) // 4)
        # Schemas that differ only in their enum values (labels per tenant, a changed tool
        # registry) share their structure: its grammar is compiled once per skeleton (the
        # structural schema cut at its placeholders' random nonce, the options, which site is
        # which field). Cut, not replaced: a schema's own text may hold any string, a fixed
        # stand-in for the nonce included, and must never make two structures one key.
        # (annotations are not in it: an edited description changes no skeleton)
        nonce = sites[0].placeholder.rsplit("-", 1)[0] if sites else ""
        text = structure_text(structural)
        skeleton = (tuple(text.split(nonce)) if nonce else (text,), repr(options.structure()), tuple(numbers))
        cached = support.skeleton(skeleton)
        self._structure_shared = cached is not None
        # no string of the structure may hold a raw control, read from its text (else its grammar's)
        plain = cached is None and plain_strings(text, options.structure())
        if cached is None and not sites:
            # no trie field: the structure is all, compiled exactly as xgrammar compiles it
            try:
                grammar, lead = support.compile_schema(text, options.structure(), plain)
            except (RuntimeError, ValueError, TypeError) as exc:
                raise SchemaError(f"xgrammar cannot compile the schema: {exc}", path="$") from None
            controls = not plain and controls_in_strings(str(grammar.grammar))
            cached = support.keep_skeleton(skeleton, Skeleton("", (), grammar, controls, lead))
        if cached is None:
            try:
                ebnf = str(xgrammar.Grammar.from_json_schema(text, **options.structure()))
            except (RuntimeError, ValueError, TypeError) as exc:
                raise SchemaError(f"xgrammar cannot compile the schema: {exc}", path="$") from None
            placeholders = [site.placeholder for site in sites]
            controls = not plain and controls_in_strings(ebnf)
            lead = SENTINEL_LEAD if controls else CONTROL_SENTINEL_LEAD
        else:
            ebnf, placeholders, lead = cached.ebnf, list(cached.placeholders), cached.lead
        fields: list[Field] = []
        for site, k, placeholder in zip(sites, numbers, placeholders, strict=True):
            if k == len(fields):
                built = compile_field(compiler, support, (site.path,), site.values, site.pattern)
                fields.append(replace(built, placeholders=(placeholder,), sentinel=field_sentinel(k, width, lead)))
            else:
                f = fields[k]
                fields[k] = replace(f, paths=(*f.paths, site.path), placeholders=(*f.placeholders, placeholder))
        if cached is None:
            grammar = support.compile_structure(ebnf, field_sentinels(fields), lead)
            cached = support.keep_skeleton(skeleton, Skeleton(ebnf, tuple(placeholders), grammar, controls, lead))
        self._ebnf = ebnf  # "" without trie fields: the compiled grammar's own text, when saved
        self._lead = cached.lead  # (the extra tokens of the vocabulary its grammar was compiled on)
        unions = {k: site for site, k in zip(sites, numbers, strict=True) if site.union is not None}
        self._unions_ready(
            compiler,
            {k: site.union for k, site in unions.items() if site.union is not None},
            {k: site.values for k, site in unions.items()},
        )
        self._finish(fields, cached.grammar, cached.controls)
        self._compile_seconds = time.perf_counter() - started

    def _admit_unenforced(self, unsupported: str) -> None:
        """Refuse, report or let pass the keywords xgrammar does not enforce (``unsupported``,
        :data:`~.fields.UNSUPPORTED`); the first in the schema's order is the one named."""
        if not self._unenforced:
            return
        first, count = self._unenforced[0], len(self._unenforced)
        keyword = first.rsplit(".", 1)[-1]
        if unsupported == "error":
            raise SchemaError(
                f"{first}: the structural engine (xgrammar) does not enforce {keyword!r}, so the output could "
                f"break it ({count} such keyword{'s' * (count > 1)}); remove it, express it with supported "
                'keywords, or compile with unsupported="warn"',
                path=first,
            )
        if unsupported == "warn":
            warnings.warn(
                UnenforcedSchemaWarning(
                    f"compiled as xgrammar compiles it, which does not enforce {keyword!r} at {first}"
                    + (f" and {count - 1} more ({', '.join(self._unenforced[1:4])}...)" if count > 1 else "")
                    + ": the output may break them",
                    paths=self._unenforced,
                ),
                stacklevel=4,
            )

    def _unions_ready(
        self, compiler: SetCompiler | None, unions: dict[int, UnionChoice], values: dict[int, tuple[str, ...]]
    ) -> None:
        """The discriminated unions' state: field ``k`` -> its union, each field value's branch
        (``values``: the discriminator's value of each branch), and the schemas of the choices
        made so far (compiled on first use by ``compiler``, shared by every request, bounded in
        bytes)."""
        self._union_compiler = compiler
        self._unions = unions
        self._union_branches = {k: {text: i for i, text in enumerate(json_texts(values[k], "$"))} for k in unions}
        self._choices: BoundedLRU[tuple[int, int], CompiledSchema] = BoundedLRU(DEFAULT_CHOICE_CACHE_BYTES)
        self._choices_lock = threading.Lock()

    def _union_values(self, union: UnionChoice) -> tuple[str, ...]:
        """The discriminator's value of each of ``union``'s branches in the stored schema."""
        found = union_values({union.keyword: union.branches(self._schema)}, self._schema)
        if found is None:
            raise AutomatonFileError("a union's branches no longer tell themselves apart", field="described")
        return found[2]

    def _choice(self, k: int, branch: int) -> CompiledSchema:
        """The schema where union field ``k`` chose ``branch``, compiled now unless cached."""
        with self._choices_lock:  # one compile at a time: a choice is compiled once
            found = self._choices.get((k, branch))
            if found is None:
                chosen = self._unions[k].chosen(self._schema, branch)
                assert self._union_compiler is not None  # (set wherever there is a union)
                # (what it does not enforce was reported for the whole schema)
                options = replace(self._options, unsupported="ignore")
                found = CompiledSchema(self._union_compiler, chosen, options, owned=True)
                self._choices.put((k, branch), found, found.memory_bytes)
            return found

    def _switches(self, k: int) -> bool:
        return k in self._unions

    def _union_stats(self) -> list[dict[str, Any]]:
        with self._choices_lock:
            chosen = [k for k, _ in self._choices]
            cached, cache = self._choices.used, self._choices.limit
        return [
            {
                "path": self._fields[k].paths[0],
                "key": union.key,
                "branches": self._fields[k].automaton.num_values,
                "repeated": union.repeated,
                "choices_compiled": chosen.count(k),
                "choice_cache_bytes": cached,
                "choice_cache_limit": cache,
            }
            for k, union in self._unions.items()
        ]

    def _exit(self, matcher: Any, k: int, node: int, value_start: bytes) -> list[Configuration]:
        if k not in self._unions:
            return super()._exit(matcher, k, node, value_start)
        text = self._fields[k].automaton.value_of(node)
        assert isinstance(text, bytes)
        # the chosen branch's schema takes over, from its start, after the text so far (its
        # language up to here is the union's: every branch's text is the same before the value)
        chosen = self._choice(k, self._union_branches[k][text])
        return chosen._configurations_after(bytes(value_start) + text)

    def _configurations_after(self, text: bytes) -> list[Configuration]:
        """The configurations after ``text`` from the start, every reading (kept per text:
        :meth:`_kept_after`)."""
        return self._kept_after(text, self._read_after)

    def _read_after(self, text: bytes) -> list[Configuration]:
        """:meth:`_configurations_after`, read. Where no field can be entered inside ``text``
        (the usual case: the union's element is the first, or the earlier ones hold no trie
        field), the structure's matcher reads it at once; else ``text`` is fed token by token
        (single-byte tokens where the vocabulary has them, else the longest token there), each
        token as a step feeds it, so fields entered and left inside ``text`` (an enum in an
        earlier element of the array) are followed as the decoding follows them."""
        (start,) = self._initial()
        if not self._enters_field(start.matcher, text):  # (xgrammar reads bytes, not tokens)
            return [start] if start.matcher.accept_string(text) else []
        token_ids = self._support.token_ids
        configurations, before, at = [start], b"", 0
        while at < len(text) and configurations:
            size = (
                1
                if text[at : at + 1] in token_ids
                else next((n for n in range(min(64, len(text) - at), 0, -1) if text[at : at + n] in token_ids), 0)
            )
            if size == 0:
                raise SchemaError(f"no token of the vocabulary spells byte {text[at]:#04x}", path="$")
            data = text[at : at + size]
            token = token_ids[data]
            configurations = [after for c in configurations for after in c.schema._token(c, token, data, before)]
            before, at = before + data, at + size
        return configurations

    def _finish(self, fields: Sequence[Field], grammar: Any, controls: bool) -> None:
        """What the fields and the structure's grammar imply (compiled or loaded alike);
        ``controls``: the grammar may admit a raw control character in a string."""
        self._fields = tuple(fields)
        self._grammar = grammar
        self._exit_rows = BoundedLRU(EXIT_ROWS_BYTES)
        self._kept = BoundedLRU(KEPT_AFTER_BYTES)
        self._kept_lock = threading.Lock()
        self._crossing: frozenset[int] = frozenset().union(*(f.crossing for f in fields))
        # the C steps inside values need every field's kernel (else they are the reference's)
        native = tuple((native_kernel(f.automaton), step_flags(f), exit_tables(f)) for f in fields)
        in_c = all(kernel is not None for kernel, _, _ in native)
        # (a tool's name, a union's discriminator: left for the grammar _exit compiles)
        plain_exits = not any(self._switches(k) for k in range(len(fields)))
        self._starts_first = bytes(sorted({c for f in fields for c in f.first}))
        self._fields_by_prefix: dict[int, list[int]] = {}
        for k, f in enumerate(fields):
            for prefix in {*f.enter_masks, *f.middle_by_prefix}:
                self._fields_by_prefix.setdefault(prefix, []).append(k)
        self._step_tables = self._support.step_tables(
            self._crossing,
            native if in_c else (),
            plain_exits,
            controls,
            self._starts_first,
            entry_tables(self._fields, self._fields_by_prefix, self._support.prefixes) if in_c and fields else None,
        )

    # ------------------------------------------------------------------ public

    @property
    def vocab_size(self) -> int:
        """The model's logits width; bitmask rows have ``ceil(vocab_size / 32)`` words."""
        return self._vocab.vocab_size

    @property
    def vocab_fingerprint(self) -> str:
        return self._vocab.fingerprint

    @property
    def schema(self) -> dict[str, Any]:
        """The schema as given (a copy)."""
        copied: dict[str, Any] = json.loads(json.dumps(self._schema))
        return copied

    @property
    def unenforced(self) -> tuple[str, ...]:
        """The paths of the schema's keywords that the structural engine (xgrammar) accepts
        but does not enforce (``"$.properties.tags.uniqueItems"``), in the schema's order:
        compiled as xgrammar compiles them (``compile_json_schema(unsupported=...)``)."""
        return self._unenforced

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._vocab.eos_token_ids

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the tries, their boundary tables and xgrammar's compiled grammar, and
        the unions' choices compiled so far."""
        with self._choices_lock:
            total = int(self._grammar.memory_size_bytes) + self._choices.used
        for f in self._fields:
            total += f.automaton.memory_bytes + f.accepting.nbytes + f.leaves.nbytes
            total += f.exit_nodes.nbytes + f.exit_pieces.nbytes + f.exit_values.nbytes
            total += sum(w.nbytes + b.nbytes for w, b in f.enter_masks.values())
            total += 64 * (len(f.tails) + len(f.middles) + len(f.crossing))
        return total

    def stats(self) -> dict[str, Any]:
        """Which fields went to which engine, their sizes, and the compile time."""
        return {
            "trie_fields": [
                {
                    "paths": list(f.paths),
                    "values": f.automaton.num_values,
                    "trie_nodes": f.automaton.num_nodes,
                    "pattern": getattr(f.automaton, "pattern", None),
                    "memory_bytes": f.automaton.memory_bytes,
                    "compile_seconds": f.compile_seconds,
                }
                for f in self._fields
            ],
            "structure": {
                "engine": "xgrammar",
                "memory_bytes": int(self._grammar.memory_size_bytes),
                # compiled for an earlier schema of the same skeleton (only the enum values differ)
                "shared": self._structure_shared,
            },
            "options": self._options.to_file(),
            # discriminated unions whose discriminator is a trie field, the rest compiled per choice
            "unions": self._union_stats(),
            # keywords xgrammar does not enforce, compiled as it compiles them (paths, schema order)
            "unenforced": list(self._unenforced),
            "memory_bytes": self.memory_bytes,
            "compile_seconds": self._compile_seconds,
        }

    # ------------------------------------------------------------------ files

    _kind = "schema"

    @property
    def fingerprint(self) -> str:
        """Fingerprint of what was compiled: the schema (or tool list) and the options."""
        return schema_fingerprint(self._kind, self._described(), self._file_options())

    def compiled_from(self, given: Any, **options: Any) -> bool:
        """Whether this is what compiling ``given`` (a schema, or a tool list for
        :class:`CompiledTools`) with ``options`` gives: the same JSON and every option equal,
        defaults included. The compile cache checks a file of its disk tier with it, so that
        a file under another schema's name never answers."""
        try:
            wanted = self._file_options_given(options)
            described = self._described_for(given)
        except (TriemaskError, TypeError, ValueError, RecursionError):
            return False
        return schema_fingerprint(self._kind, described, wanted) == self.fingerprint

    def _described(self) -> Any:
        """What the file stores to describe what was compiled (the tool list for tools)."""
        return self._schema

    @classmethod
    def _described_for(cls, given: Any) -> Any:
        """:meth:`_described` of what compiling ``given`` would give."""
        return load_schema(given)

    def _file_options(self) -> dict[str, Any]:
        return self._options.to_file()

    @classmethod
    def _file_options_given(cls, options: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`_file_options` would be for a compile with keyword ``options``."""
        return SchemaOptions.given(options).to_file()

    def _file_parts(self) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
        arrays: dict[str, npt.NDArray[Any]] = {
            "described": text_array(json.dumps(self._described())),  # key order is language
            "ebnf": text_array(self._ebnf or str(self._grammar.grammar)),
            "grammar": text_array(self._grammar.serialize_json()),
        }
        fields = []
        for k, f in enumerate(self._fields):
            kind, automaton_meta, automaton_arrays = f.automaton.file_parts()
            arrays.update({f"f{k}.automaton.{name}": array for name, array in automaton_arrays.items()})
            arrays.update({f"f{k}.{name}": array for name, array in field_tables(f).items()})
            fields.append(
                {
                    "paths": list(f.paths),
                    "placeholders": list(f.placeholders),
                    "sentinel": f.sentinel.hex(),
                    "first": f.first.hex(),
                    "last": f.last.hex(),
                    "pieces_fingerprint": f.pieces.fingerprint,
                    "automaton_kind": kind,
                    "automaton_meta": automaton_meta,
                    "compile_seconds": f.compile_seconds,
                    "union": None if k not in self._unions else dataclasses.asdict(self._unions[k]),
                }
            )
        meta = {
            "vocab_fingerprint": self._vocab.fingerprint,
            "options": self._file_options(),
            "xgrammar_version": version("xgrammar"),
            "compile_seconds": self._compile_seconds,
            "fields": fields,
            "lead": self._lead,
        }
        return meta, arrays

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the compiled schema to ``path`` in triemask's file format (no pickle): the
        schema, its options, every enum field's automaton and boundary tables, and
        xgrammar's compiled structure, with the vocabulary's fingerprint, checksummed and
        written atomically. Load it with :meth:`load`."""
        meta, arrays = self._file_parts()
        storage.write(
            path, self._kind, meta, arrays, vocab_fingerprint=self._vocab.fingerprint, set_fingerprint=self.fingerprint
        )

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], *, vocab: Any, mmap: bool = True, verify: bool = True
    ) -> CompiledSchema:
        """Load a compiled schema (or tool list) written by :meth:`save`.

        Parameters
        ----------
        path : str or path
            The file.
        vocab : Vocabulary or SetCompiler
            The vocabulary it must have been compiled for (checked by fingerprint). A tool
            list compiles its tools' argument schemas on demand with this compiler (one is
            made from a vocabulary).
        mmap, verify : bool
            As in :meth:`TrieAutomaton.load`.

        Raises
        ------
        AutomatonFileError
            The file is missing, truncated, corrupt, not a triemask file, of a newer format,
            not a compiled schema of this class, or compiled for another vocabulary, or its
            fields were built by a triemask whose token pieces differ (``.field``).
        """
        if isinstance(vocab, SetCompiler):
            compiler: SetCompiler | None = vocab
            vocabulary = vocab.vocab
        elif isinstance(vocab, Vocabulary):
            compiler, vocabulary = None, vocab
        else:
            raise ArgumentTypeError(
                f"load needs vocab=<the triemask.Vocabulary or Compiler>, got {type(vocab).__qualname__}"
            )

        def build(stored: storage.Stored) -> CompiledSchema:
            held = kind_class(stored.kind, stored.source)
            if not issubclass(held, cls):
                raise AutomatonFileError(f"{stored.source} holds a {held.__name__}, not a {cls.__name__}", field="kind")
            return held._restore(stored, vocabulary, compiler)

        return storage.load(
            path,
            kinds=kinds_of(CompiledSchema),
            vocab_fingerprint=vocabulary.fingerprint,
            build=build,
            use_mmap=mmap,
            verify=verify,
        )

    @classmethod
    def _restore(cls, stored: storage.Stored, vocab: Vocabulary, compiler: SetCompiler | None) -> CompiledSchema:
        require_xgrammar()
        import xgrammar

        self = cls.__new__(cls)
        meta, arrays, source = stored.meta, stored.arrays, stored.source
        support = vocabulary_support(vocab)
        try:
            options = meta["options"]
            self._options = SchemaOptions.from_file(options)
            described = json.loads(array_text(arrays["described"]))
            self._ebnf = array_text(arrays["ebnf"])
            grammar_json = array_text(arrays["grammar"])
            fields = [restore_field(stored, support, k, entry) for k, entry in enumerate(meta["fields"])]
            unions = {
                k: UnionChoice(tuple(u["pointer"]), u["key"], u["keyword"], bool(u["repeated"]))
                for k, entry in enumerate(meta["fields"])
                if (u := entry.get("union")) is not None
            }
            self._compile_seconds = float(meta["compile_seconds"])
            self._structure_shared = False  # rebuilt from the file
        except AutomatonFileError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, StateError) as error:
            raise AutomatonFileError(
                f"{source} is corrupt: its fields do not form a compiled schema ({type(error).__name__}: {error})",
                field="arrays",
            ) from None
        self._vocab = vocab
        self._support = support
        controls = controls_in_strings(self._ebnf) if self._ebnf else None
        self._lead = lead = _stored_lead(fields, meta.get("lead"), controls, source)
        try:  # xgrammar's own form; compiled again from the structure's grammar text when its
            # xgrammar version reads it no longer
            grammar = xgrammar.CompiledGrammar.deserialize_json(grammar_json, support.tokenizer_info(lead))
        except Exception:  # xgrammar raises several kinds for one answer: not readable
            try:
                grammar = support.compile_structure(self._ebnf, field_sentinels(fields), lead)
            except Exception as error:
                raise AutomatonFileError(
                    f"{source} is corrupt: its structure's grammar does not compile ({error})", field="ebnf"
                ) from None
        self._unions = unions  # (which fields switch: _finish reads it; checked below)
        self._finish(fields, grammar, controls_in_strings(str(grammar.grammar)) if controls is None else controls)
        self._restore_described(described, meta, vocab, compiler)
        if unions and compiler is None:
            compiler = SetCompiler(vocab)  # (the choices compile with it)
        self._restore_unions(unions, fields, compiler, source)
        return self

    def _restore_unions(
        self, unions: dict[int, UnionChoice], fields: list[Field], compiler: SetCompiler | None, source: str
    ) -> None:
        """The stored unions, checked against the stored schema: each is there, and its
        discriminator's values are its field's values."""
        values: dict[int, tuple[str, ...]] = {}
        try:
            for k, union in unions.items():
                values[k] = self._union_values(union)
                texts = json_texts(values[k], "$")
                if set(texts) != set(fields[k].automaton.values()) or len(texts) != len(set(texts)):
                    raise ValueError(f"field {k}'s values are not its union's")
        except (AutomatonFileError, KeyError, IndexError, TypeError, ValueError) as error:
            raise AutomatonFileError(
                f"{source} is corrupt: a union does not match its field ({error})", field="fields"
            ) from None
        self._unions_ready(compiler, unions, values)

    def _restore_described(
        self, described: Any, meta: dict[str, Any], vocab: Vocabulary, compiler: SetCompiler | None
    ) -> None:
        self._schema = load_schema(described)
        self._unenforced = dispatch(self._schema, 1, patterns=False)[2]  # (reported when compiled)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickling goes through the file format, with the vocabulary (a schema needs its tokens)
        meta, arrays = self._file_parts()
        blob = storage.to_bytes(
            self._kind, meta, arrays, vocab_fingerprint=self._vocab.fingerprint, set_fingerprint=self.fingerprint
        )
        return (schema_from_bytes, (blob, self._vocab))

    def __repr__(self) -> str:
        sizes = ", ".join(str(f.automaton.num_values) for f in self._fields)
        return f"CompiledSchema(trie fields: [{sizes}], vocab_size={self.vocab_size})"


def _stored_lead(fields: list[Field], stored: Any, controls: bool | None, source: str) -> int:
    """The lead of the extra tokens of the vocabulary the stored grammar was compiled on: the
    file's ``lead`` (``stored``; absent from files before it), which the fields' sentinels
    share (each checked by :func:`~.fields.restore_field` to lead with one of
    :data:`~.structure.SENTINEL_LEADS`), else 0xFF; 0xFF wherever the grammar (``controls``:
    may admit a raw control in a string; None: not known) lets a string hold the control
    lead, which would forge a field's entry there."""
    leads = {f.sentinel[0] for f in fields}
    if stored is not None:
        leads.add(stored if type(stored) is int else -1)
    leads = leads or {SENTINEL_LEAD}
    if len(leads) > 1 or not leads <= set(SENTINEL_LEADS) or (controls and leads != {SENTINEL_LEAD}):
        raise AutomatonFileError(
            f"{source} is corrupt: the leads of its sentinels and extra tokens {sorted(leads)} do not fit its "
            "structure's grammar",
            field="sentinel",
        )
    return leads.pop()


def schema_from_bytes(blob: bytes, vocab: Vocabulary) -> CompiledSchema:
    """The compiled schema of a pickle (:meth:`CompiledSchema.__reduce__`)."""
    stored = storage.read(blob, kinds=kinds_of(CompiledSchema))
    stored.check_vocabulary(vocab.fingerprint)
    return cast(CompiledSchema, kind_class(stored.kind, stored.source))._restore(stored, vocab, None)


register_kind("schema", CompiledSchema)
