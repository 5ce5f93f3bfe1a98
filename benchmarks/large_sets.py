"""Real sets of more than 500,000 strings, fetched from package registries once and cached.

``words``: the 663,473 English words of Debian's ``wamerican-insane`` (SCOWL, size 95;
licence: SCOWL's, permissive, in the package's copyright file), read from the ``.deb``
with the standard library (an ``ar`` archive holding ``data.tar.xz``).

``npm-names``: the 4,499,322 public npm package names of ``all-the-package-names``
2.0.2578 (MIT), from the npm registry's tarball.

Both are pinned by version and SHA-256 and cached under the benchmark cache
(``TRIEMASK_BENCH_CACHE``, default ``~/.cache/triemask-bench``); nothing in ``make test``
reads them.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import sys
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from .vocabs import cache_dir

WORDS_DEB = (
    "http://deb.debian.org/debian/pool/main/s/scowl/wamerican-insane_2020.12.07-2_all.deb",
    "7ad9f4dde6a07c1dc33c7bdc2435940a889805b9d32286eb8afe6434109e4a0a",
)
NPM_NAMES = (
    "https://registry.npmjs.org/all-the-package-names/-/all-the-package-names-2.0.2578.tgz",
    "89cccbb8825c8b60fa65a69aa558facd9dcebff951024d321478ed720adf1b85",
)
LARGE_SETS = ("words", "npm-names")


def _fetch(url: str, sha256: str) -> bytes:
    """The file at ``url``, downloaded once into the cache and checked against ``sha256``."""
    target = cache_dir() / url.rsplit("/", 1)[1]
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"fetching {url} (once) into {target.parent}", file=sys.stderr)
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
        target.with_suffix(".part").write_bytes(data)
        target.with_suffix(".part").rename(target)
    data = target.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{target} has SHA-256 {digest}, expected {sha256}: delete it to fetch it again")
    return data


def _deb_member(deb: bytes, name: str) -> bytes:
    """A member of a ``.deb``'s ``data.tar.xz`` (a .deb is an ``ar`` archive)."""
    if not deb.startswith(b"!<arch>\n"):
        raise RuntimeError("not a .deb (ar) archive")
    offset = 8
    while offset + 60 <= len(deb):
        header = deb[offset : offset + 60]
        member, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = deb[offset + 60 : offset + 60 + size]
        if member == "data.tar.xz":
            with tarfile.open(fileobj=io.BytesIO(lzma.decompress(body))) as archive:
                source = archive.extractfile(name)
                if source is None:
                    raise RuntimeError(f"{name} is not a file in the .deb")
                return source.read()
        offset += 60 + size + (size & 1)
    raise RuntimeError("the .deb has no data.tar.xz")


def load_large(name: str) -> list[str]:
    """The real set ``name`` (``words`` or ``npm-names``), distinct strings in the source's order."""
    if name == "words":
        text = _deb_member(_fetch(*WORDS_DEB), "./usr/share/dict/american-english-insane").decode("utf-8")
        return list(dict.fromkeys(text.splitlines()))
    if name == "npm-names":
        with tarfile.open(fileobj=io.BytesIO(_fetch(*NPM_NAMES))) as archive:
            source = archive.extractfile("package/names.json")
            assert source is not None
            return list(dict.fromkeys(json.load(source)))
    raise ValueError(f"unknown large set {name!r}; choose from {', '.join(LARGE_SETS)}")


def synthetic_ids(k: int, seed: int = 0) -> list[str]:
    """``k`` distinct identifiers like ``service_000123456.method_123456``: little shared
    structure beyond the fixed parts (the set that once broke the 64-bit edge keys)."""
    rng = np.random.default_rng(seed)
    services = rng.choice(10**9, size=k, replace=False)
    methods = rng.integers(0, 10**6, size=k)
    return [f"service_{s:09d}.method_{m:06d}" for s, m in zip(services.tolist(), methods.tolist(), strict=True)]


def cached(name: str) -> Path | None:
    """Where the set's download is cached, if it is (for the report)."""
    url = {"words": WORDS_DEB, "npm-names": NPM_NAMES}[name][0]
    path = cache_dir() / url.rsplit("/", 1)[1]
    return path if path.exists() else None
