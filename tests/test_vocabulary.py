"""Vocabulary: construction, validation, and byte tables of real tokenizers."""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest

from conftest import RealVocabulary, byte_vocabulary
from triemask import Vocabulary, VocabularyError

SAMPLES = [
    "Hello world",
    " Hello World!",
    "get_user",
    "slack.get_user_by_id",
    "E11.9 S72.001A",
    "ENTY:cremat",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "Äpfel, нещо на Български, 日本語のテキスト",
    " this is 🦙.cpp 👩‍👩‍👧",
    "<|im_end|> looks special but is text",
    "3333333 333.333 1e-9",
]


def test_real_vocabularies_round_trip(real: RealVocabulary) -> None:
    """The reference tokenization of each sample decodes to the sample's bytes."""
    for text in SAMPLES:
        ids = real.encode(text)
        decoded = real.vocab.decode(ids)
        expected = (b" " if real.prefix_space else b"") + text.encode("utf-8")
        assert decoded == expected, (real.name, text, ids)


def test_real_vocabularies_basic_facts(real: RealVocabulary) -> None:
    stats = real.vocab.stats()
    assert stats["text_tokens"] > 30000
    assert real.vocab.eos_token_ids, "every real vocabulary has an EOS id by default"
    for eos in real.vocab.eos_token_ids:
        assert real.vocab.token_bytes(eos) is None
    # every single byte is spellable: byte-level BPE or SentencePiece byte fallback
    singles = {real.vocab.token_bytes(int(i)) for i in real.vocab.text_token_ids()}
    assert all(bytes([b]) in singles for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5)


def test_qwen_vocab_size_and_specials(qwen: RealVocabulary) -> None:
    vocab = qwen.vocab
    assert vocab.vocab_size == 151936 and len(vocab) == 151851
    assert vocab.eos_token_ids == (151643, 151645)
    assert vocab.token_bytes(151644) is None  # <|im_start|>
    assert vocab.token_bytes(151900) is None  # padding id past the table
    assert vocab.stats()["padding_ids"] == 151936 - 151851


def test_constructor_validation() -> None:
    with pytest.raises(VocabularyError, match="vocab_size=2 is smaller than the token table, which has 3 ids"):
        Vocabulary([b"a", b"b", None], eos_token_ids=2, vocab_size=2)
    with pytest.raises(VocabularyError, match="EOS token id 1 decodes to text b'b'"):
        Vocabulary([b"a", b"b", None], eos_token_ids=1)
    with pytest.raises(VocabularyError, match=r"EOS token id 9 is outside \[0, vocab_size=3\)"):
        Vocabulary([b"a", b"b", None], eos_token_ids=9)
    with pytest.raises(VocabularyError, match="token_bytes\\[1\\] must be bytes or None, got str 'b'"):
        Vocabulary([b"a", "b", None], eos_token_ids=2)  # type: ignore[list-item]
    with pytest.raises(VocabularyError, match="EOS token ids must be integers"):
        Vocabulary([b"a", None], eos_token_ids=["1"])  # type: ignore[list-item]
    with pytest.raises(VocabularyError, match="vocab_size must be an integer"):
        Vocabulary([b"a", None], eos_token_ids=1, vocab_size=2.0)  # type: ignore[arg-type]


def test_accessors_and_fingerprint() -> None:
    vocab = Vocabulary([b"a", b"", bytearray(b"ab"), None], eos_token_ids=3, vocab_size=10)
    assert (vocab.vocab_size, len(vocab), vocab.eos_token_ids) == (10, 4, (3,))
    assert vocab.token_bytes(1) is None  # empty bytes emit nothing: treated as no text
    assert vocab.token_bytes(2) == b"ab" and vocab.token_bytes(7) is None
    assert vocab.text_token_ids().tolist() == [0, 2]
    with pytest.raises(VocabularyError, match="token id 10 is outside"):
        vocab.token_bytes(10)
    same = Vocabulary([b"a", None, b"ab", None], eos_token_ids=[3], vocab_size=10)
    assert vocab.fingerprint == same.fingerprint and vocab == same and hash(vocab) == hash(same)
    other = Vocabulary([b"a", None, b"ab", None], eos_token_ids=[3], vocab_size=11)
    assert other.fingerprint != vocab.fingerprint
    assert "vocab_size=10" in repr(vocab)


def test_byte_vocabulary_fixture() -> None:
    vocab = byte_vocabulary()
    assert vocab.stats()["text_tokens"] == 264 and vocab.vocab_size == 272


# --------------------------------------------------------------------------- Hugging Face


def _train(kind: str):  # type: ignore[no-untyped-def]
    from tokenizers import implementations

    corpus = [text for text in SAMPLES for _ in range(3)] + ["get user slack github update_invoice"] * 5
    if kind == "byte_level":
        tok = implementations.ByteLevelBPETokenizer()
        tok.train_from_iterator(corpus, vocab_size=400, min_frequency=1, show_progress=False)
    else:
        tok = implementations.SentencePieceBPETokenizer()
        tok.train_from_iterator(corpus, vocab_size=300, min_frequency=1, show_progress=False)
    return tok._tokenizer


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_from_huggingface_tokenizers_round_trip(kind: str) -> None:
    backend = _train(kind)
    vocab = Vocabulary.from_huggingface(backend, eos_token_ids=[])
    decoder = json.loads(backend.to_str())["decoder"]["type"]
    assert decoder == ("ByteLevel" if kind == "byte_level" else "Metaspace")
    for text in SAMPLES[:6]:
        ids = backend.encode(text).ids
        decoded = vocab.decode(ids)
        assert decoded.strip() == text.strip().encode(), (kind, text, decoded)


def test_from_huggingface_transformers_fast_with_added_tokens() -> None:
    from transformers import PreTrainedTokenizerFast

    backend = _train("byte_level")
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>")
    hf.add_tokens(["<tool_call>"])  # an added, non-special token: ordinary text
    vocab = Vocabulary.from_huggingface(hf, vocab_size=len(hf) + 5)
    end = hf.convert_tokens_to_ids("<|end|>")
    tool = hf.convert_tokens_to_ids("<tool_call>")
    assert vocab.eos_token_ids == (end,) and vocab.token_bytes(end) is None
    assert vocab.token_bytes(tool) == b"<tool_call>"
    assert vocab.vocab_size == len(hf) + 5
    for text in ["Hello world", "get_user <tool_call> x"]:
        assert vocab.decode(hf.encode(text, add_special_tokens=False)) == text.encode()


def test_from_huggingface_slow_sentencepiece() -> None:
    """transformers 4.x "slow" tokenizers expose ``sp_model`` (transformers 5 has none)."""
    import sentencepiece

    from conftest import _mistral_file

    class SlowTokenizer:  # the attributes a slow SentencePiece tokenizer offers
        sp_model = sentencepiece.SentencePieceProcessor(model_file=str(_mistral_file("tokenizer.model.v1")))
        eos_token_id = 2
        added_tokens_decoder: ClassVar[dict[int, object]] = {}

    vocab = Vocabulary.from_huggingface(SlowTokenizer())
    reference = Vocabulary.from_sentencepiece(_mistral_file("tokenizer.model.v1"))
    assert vocab.eos_token_ids == reference.eos_token_ids == (2,)
    assert vocab.fingerprint == reference.fingerprint
    assert vocab.decode(SlowTokenizer.sp_model.encode("Hello world")) == b" Hello world"


def test_from_huggingface_rejects_wordpiece() -> None:
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    with pytest.raises(VocabularyError, match="context-dependent"):
        Vocabulary.from_huggingface(tok, eos_token_ids=[])
    with pytest.raises(VocabularyError, match="unsupported tokenizer type"):
        Vocabulary.from_huggingface(object())


# --------------------------------------------------------------------------- SentencePiece, GGUF


def test_from_sentencepiece_matches_the_processor() -> None:
    import sentencepiece

    from conftest import _mistral_file

    path = _mistral_file("tokenizer.model.v1")
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = Vocabulary.from_sentencepiece(path)
    assert Vocabulary.from_sentencepiece(processor).fingerprint == vocab.fingerprint
    assert Vocabulary.from_sentencepiece(path.read_bytes()).fingerprint == vocab.fingerprint
    for i in range(processor.get_piece_size()):
        piece = processor.id_to_piece(i)
        if processor.is_control(i) or processor.is_unknown(i):
            assert vocab.token_bytes(i) is None
        elif processor.is_byte(i):
            assert vocab.token_bytes(i) == bytes([int(piece[3:5], 16)])
        else:
            assert vocab.token_bytes(i) == piece.replace("\u2581", " ").encode()
    with pytest.raises(VocabularyError, match="cannot read SentencePiece model"):
        Vocabulary.from_sentencepiece("/nonexistent/tokenizer.model")


def _write_gguf(path, model: str, tokens: list[str], types: list[int], eos: int) -> None:  # type: ignore[no-untyped-def]
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_eos_token_id(eos)
    writer.add_string("general.name", "tiny")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


def test_from_gguf_byte_level_and_sentencepiece(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from triemask.vocab.readers import byte_level_decoder

    to_unicode = {b: c for c, b in byte_level_decoder().items()}
    encode = lambda raw: "".join(to_unicode[b] for b in raw)  # noqa: E731
    _write_gguf(tmp_path / "bpe.gguf", "gpt2", [encode(b" hello"), encode(b"\n"), "<|eot|>", "<tool>"], [1, 1, 3, 4], 2)
    vocab = Vocabulary.from_gguf(tmp_path / "bpe.gguf")
    assert [vocab.token_bytes(i) for i in range(4)] == [b" hello", b"\n", None, b"<tool>"]
    assert vocab.eos_token_ids == (2,)

    _write_gguf(
        tmp_path / "spm.gguf", "llama", ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581hi", "x"], [2, 3, 3, 6, 1, 1], 2
    )
    vocab = Vocabulary.from_gguf(tmp_path / "spm.gguf", vocab_size=8)
    assert [vocab.token_bytes(i) for i in range(6)] == [None, None, None, b"\n", b" hi", b"x"]
    assert vocab.vocab_size == 8

    _write_gguf(tmp_path / "bert.gguf", "bert", ["[CLS]", "a"], [3, 1], 0)
    with pytest.raises(VocabularyError, match="tokenizer model 'bert' is not supported"):
        Vocabulary.from_gguf(tmp_path / "bert.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(VocabularyError, match="is not a GGUF file"):
        Vocabulary.from_gguf(tmp_path / "junk.gguf")


def test_gguf_reader_agrees_with_the_gguf_package(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import gguf

    from triemask.vocab.readers import read_gguf_tokenizer

    tokens = [f"tok{i}" for i in range(50)]
    _write_gguf(tmp_path / "t.gguf", "llama", tokens, [1] * 50, 7)
    ours = read_gguf_tokenizer(tmp_path / "t.gguf")
    theirs = gguf.GGUFReader(str(tmp_path / "t.gguf")).fields
    field = theirs["tokenizer.ggml.tokens"]
    assert ours["tokenizer.ggml.tokens"] == [bytes(field.parts[i]) for i in field.data]
    assert np.array_equal(ours["tokenizer.ggml.token_type"], np.ones(50))
    assert ours["tokenizer.ggml.eos_token_id"] == 7


def test_from_tiktoken_and_mistral_errors() -> None:
    with pytest.raises(VocabularyError, match="not a tiktoken-style encoding"):
        Vocabulary.from_tiktoken(object())
    with pytest.raises(VocabularyError, match="unsupported mistral_common tokenizer"):
        Vocabulary.from_mistral(object())


def test_byte_level_alphabet() -> None:
    from triemask.vocab.readers import byte_level_decoder, decode_byte_level

    table = byte_level_decoder()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert decode_byte_level("\u0120hello\u010a") == b" hello\n"  # "Ġhello" + "Ċ"
    assert decode_byte_level("\u200d") == "\u200d".encode()  # outside the alphabet: raw UTF-8, like HF
