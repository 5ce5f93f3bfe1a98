"""Tokenizer files from careless or hostile sources: GGUF, SentencePiece models and
tokenizer.json. Every malformed input is a VocabularyError naming where it went wrong,
in bounded time and memory; a large GGUF file is mapped, never read whole."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_files import (
    ARRAY,
    SMALL_SENTENCEPIECE,
    STRING,
    UINT32,
    gguf_bytes,
    sentencepiece_bytes,
    tokenizer_gguf,
)
from triemask import Vocabulary, VocabularyError

_MEMORY_BOUND = 64 << 20  # far above what any of these small files needs


def _bounded(read, data: bytes) -> None:  # type: ignore[no-untyped-def]
    """``read(data)`` returns or raises VocabularyError, in under 2 s, allocating < 64 MiB."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        read(data)
    except VocabularyError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - started < 2.0
    assert peak < _MEMORY_BOUND, peak


def test_the_files_written_here_are_valid(tmp_path: Path) -> None:
    (tmp_path / "t.gguf").write_bytes(tokenizer_gguf())
    vocab = Vocabulary.from_gguf(tmp_path / "t.gguf")
    assert vocab.token_bytes(4) == b" " and vocab.token_bytes(5) == b"hello" and vocab.eos_token_ids == (6,)
    spm = Vocabulary.from_sentencepiece(sentencepiece_bytes(SMALL_SENTENCEPIECE))
    assert spm.token_bytes(3) == b"\n" and spm.token_bytes(4) == b" hi" and spm.eos_token_ids == (2,)


def test_a_tiny_gguf_cannot_ask_for_a_huge_allocation(tmp_path: Path) -> None:
    """``tokenizer.ggml.model`` stored as the integer 890,000,000: once bytes(N) of 890 MB."""
    path = tmp_path / "model-as-int.gguf"
    path.write_bytes(gguf_bytes([("tokenizer.ggml.model", UINT32, 890_000_000)]))
    assert path.stat().st_size < 120
    with pytest.raises(
        VocabularyError, match=r"offset 52 \(tokenizer\.ggml\.model\): expected a string, got GGUF value type 4"
    ):
        _bounded(lambda _: Vocabulary.from_gguf(path), b"")
        Vocabulary.from_gguf(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([("tokenizer.ggml.model", STRING, b"gpt2")], "has no tokenizer.ggml.tokens"),
        ([("tokenizer.ggml.tokens", STRING, b"a")], r"tokenizer\.ggml\.tokens\): expected an array of strings"),
        ([("tokenizer.ggml.token_type", ARRAY, (STRING, [b"1"]))], "expected an array of integers"),
        ([("tokenizer.ggml.eos_token_id", STRING, b"2")], r"eos_token_id\): expected an integer"),
    ],
)
def test_gguf_fields_of_the_wrong_type_are_named(tmp_path: Path, fields: list, message: str) -> None:  # type: ignore[type-arg]
    path = tmp_path / "t.gguf"
    path.write_bytes(gguf_bytes(fields))
    with pytest.raises(VocabularyError, match=message):
        Vocabulary.from_gguf(path)


def test_a_string_past_the_end_of_the_file_is_an_error_not_a_truncation(tmp_path: Path) -> None:
    data = tokenizer_gguf()
    path = tmp_path / "cut.gguf"
    types = data.index(b"tokenizer.ggml.token_type")
    path.write_bytes(data[: types + 40])  # cuts inside the token types
    with pytest.raises(VocabularyError, match=r"malformed GGUF at offset \d+ \(tokenizer\.ggml\.token_type\)"):
        Vocabulary.from_gguf(path)
    where = data.index(b"hello") - 8  # the length of the string "hello"
    path.write_bytes(data[:where] + struct.pack("<Q", 10**9) + data[where + 8 :])
    with pytest.raises(VocabularyError, match=r"tokenizer\.ggml\.tokens\[5\]\): 1000000000 bytes needed"):
        Vocabulary.from_gguf(path)
    huge = data.index(b"\x08\x00\x00\x00", data.index(b"tokenizer.ggml.tokens")) + 4  # the array's count
    path.write_bytes(data[:huge] + struct.pack("<Q", 2**63) + data[huge + 8 :])
    with pytest.raises(VocabularyError, match="cannot fit in the rest of the file"):
        Vocabulary.from_gguf(path)


def test_token_text_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(tokenizer_gguf(tokens=[b"ok", b"\xff\xfe", b"<eos>"]))
    with pytest.raises(VocabularyError, match=r"tokenizer\.ggml\.tokens\[1\] = b'\\xff\\xfe' is not valid text"):
        Vocabulary.from_gguf(path)


def test_gguf_weights_are_never_read(tmp_path: Path) -> None:
    """A 4 GiB GGUF (metadata, then a sparse hole standing for the tensors): resident
    memory stays small; reading the file whole would take 4 GiB."""
    path = tmp_path / "big.gguf"
    with path.open("wb") as file:
        file.write(tokenizer_gguf())
        file.truncate(4 << 30)
    script = (  # VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec)
        "from triemask import Vocabulary; "
        f"v = Vocabulary.from_gguf({str(path)!r}); assert len(v) == 7; "
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
    )
    peak_kib = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    assert peak_kib < 400_000, f"{peak_kib} KiB resident"


def test_the_sentencepiece_reader_is_linear_and_bounded() -> None:
    started = time.perf_counter()
    with pytest.raises(VocabularyError, match="longer than 10 bytes"):
        Vocabulary.from_sentencepiece(b"\x08" + b"\xff" * 400_000)  # once 10 s (a quadratic varint)
    with pytest.raises(VocabularyError, match="runs past the end"):
        Vocabulary.from_sentencepiece(b"\x08\xff\xff")
    assert time.perf_counter() - started < 1.0
    good = sentencepiece_bytes(SMALL_SENTENCEPIECE)
    with pytest.raises(VocabularyError, match=r"field 2 at offset \d+ holds \d+ bytes but only \d+ remain"):
        Vocabulary.from_sentencepiece(good[:-1])
    with pytest.raises(VocabularyError, match=r"piece #0 at offset \d+ is not valid UTF-8"):
        Vocabulary.from_sentencepiece(sentencepiece_bytes([("x", 1)]).replace(b"x", b"\xff"))


_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _mutations(seed: bytes) -> st.SearchStrategy[bytes]:
    """Point changes, truncations and insertions of a valid file (most land in lengths,
    counts and types, since those make up most of these small files)."""
    edits = st.lists(
        st.tuples(
            st.integers(0, len(seed) - 1), st.sampled_from(["set", "cut", "insert"]), st.binary(min_size=1, max_size=8)
        ),
        min_size=1,
        max_size=4,
    )

    def apply(changes: list[tuple[int, str, bytes]]) -> bytes:
        data = bytearray(seed)
        for position, kind, payload in changes:
            position %= max(len(data), 1)
            if kind == "set":
                data[position : position + len(payload)] = payload
            elif kind == "cut":
                del data[position:]
            else:
                data[position:position] = payload
        return bytes(data)

    return edits.map(apply)


@_FUZZ
@given(_mutations(tokenizer_gguf()))
def test_fuzz_gguf(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "t.gguf"
    path.write_bytes(data)
    _bounded(lambda _: Vocabulary.from_gguf(path), data)


@_FUZZ
@given(_mutations(sentencepiece_bytes(SMALL_SENTENCEPIECE)))
def test_fuzz_sentencepiece(data: bytes) -> None:
    _bounded(Vocabulary.from_sentencepiece, data)


def _tokenizer_json() -> str:
    from conftest import byte_level_tokenizer

    return str(byte_level_tokenizer().backend_tokenizer.to_str())  # type: ignore[attr-defined]


@_FUZZ
@given(st.data())
def test_fuzz_tokenizer_json(data: st.DataObject) -> None:
    """Decoders, added tokens and vocabularies rewritten; what the tokenizers library
    accepts, triemask reads or refuses with a VocabularyError."""
    tokenizers = pytest.importorskip("tokenizers")
    config = json.loads(_tokenizer_json())
    decoder = data.draw(
        st.sampled_from(
            [
                None,
                {"type": "ByteLevel"},
                {"type": "WordPiece", "prefix": "##"},
                {
                    "type": "Sequence",
                    "decoders": [
                        {"type": "ByteFallback"},
                        {"type": "Replace", "pattern": {"Regex": "x"}, "content": "y"},
                    ],
                },
                {"type": "Sequence", "decoders": [{"type": "Metaspace", "replacement": "\u2581"}, {"type": "Fuse"}]},
                {"type": "CTC"},
            ]
        )
    )
    config["decoder"] = decoder
    for token in data.draw(st.lists(st.text(max_size=6), max_size=4)):
        config["added_tokens"].append(
            {
                "id": len(config["model"]["vocab"]) + len(config["added_tokens"]),
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": data.draw(st.booleans()),
            }
        )
    try:
        tokenizer = tokenizers.Tokenizer.from_str(json.dumps(config))
    except Exception:
        return
    _bounded(lambda _: Vocabulary.from_huggingface(tokenizer), b"")
