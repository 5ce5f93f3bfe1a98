"""Markdown tables, plots and the console summary of a benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Documented provider limits the paper marks in Fig. 1a.
PROVIDER_LIMITS = {"Gemini ~120": 120, "Anthropic ~200": 200, "OpenAI 1,000": 1_000}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def _ratio(peer: float | None, ours: float | None) -> str:
    return "-" if not peer or not ours else f"{peer / ours:.3g}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _compile_cell(entry: dict[str, Any] | None, key: str = "compile_s") -> tuple[str, float | None]:
    if entry is None:
        return "-", None
    if entry["status"] == "ok":
        return _ms(entry[key]), entry[key]
    if entry["status"] == "timeout":
        return f"timeout (>{entry['timeout_s']:.0f} s)", None
    return "error", None


def compile_rows(results: dict[str, Any], key: str) -> tuple[list[str], list[list[str]]]:
    sweeps = results["compile"]
    engines = list(sweeps)
    sizes = list(next(iter(sweeps.values()))["sizes"])
    rows = []
    for k in sizes:
        cells, times = [], {}
        for name in engines:
            entry = sweeps[name]["sizes"].get(k)
            if key == "cold_s" and entry and entry["status"] == "ok":
                entry = {**entry, "cold_s": sweeps[name]["prepare_s"] + entry["first_s"]}
            text, value = _compile_cell(entry, key)
            cells.append(text)
            times[name] = value
        ratios = [_ratio(times[name], times["triemask"]) for name in engines if name != "triemask"]
        rows.append([f"{int(k):,}", *cells, *ratios])
    header = ["K", *engines, *[f"{name} / triemask" for name in engines if name != "triemask"]]
    return header, rows


def markdown(results: dict[str, Any]) -> str:
    m, v = results["machine"], results["versions"]
    parts = [
        f"# triemask benchmark ({results['run']} run, {results['date']})\n",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}, Python {m['python']}.  \n"
        + "Libraries: "
        + ", ".join(f"{name} {version}" for name, version in v.items())
        + f".  \nVocabulary: {results['vocabulary']} unless stated; ratios are peer time / triemask time "
        f"(above 1: triemask faster), same run. Whole run: {results['seconds']:.0f} s.\n",
    ]
    if "compile" in results:
        parts.append(
            "\n## Compile time, tokenizer prepared (Table 4)\n\nTime to the first mask; median of repeats.\n\n"
        )
        parts.append(_table(*compile_rows(results, "compile_s")))
        parts.append("\n## Compile time, cold\n\nTokenizer preparation (once per process) + first compile.\n\n")
        parts.append(_table(*compile_rows(results, "cold_s")))
        prepare = [[name, _ms(s.get("prepare_s"))] for name, s in results["compile"].items()]
        parts.append("\nTokenizer preparation alone:\n\n" + _table(["engine", "prepare"], prepare))
        parts.append(memory_table(results))
    if "decode" in results:
        parts.append(decode_tables(results))
    if "families" in results:
        parts.append(families_table(results))
    if "token_trie" in results:
        parts.append(token_trie_table(results))
    if "sets" in results:
        parts.append(sets_tables(results))
    if "million" in results:
        entry = results["million"]["sizes"]["1000000"]
        if entry["status"] == "ok":
            parts.append(
                "\n## K = 1,000,000 (triemask alone)\n\n"
                f"Compile {entry['first_s']:.2f} s (fresh process, index prepared); automaton "
                f"{entry['memory_bytes'] / 1e6:.0f} MB (memory_bytes), RSS after compile "
                f"+{entry['rss_delta_bytes'] / 1e6:.0f} MB, peak RSS during compile "
                f"+{entry.get('peak_rss_delta_bytes', 0) / 1e6:.0f} MB.\n"
            )
        else:
            parts.append(f"\n## K = 1,000,000 (triemask alone)\n\n{entry}\n")
    parts.append(targets_table(results))
    return "".join(parts)


def memory_table(results: dict[str, Any]) -> str:
    sweeps = results["compile"]
    rows = []
    for k in next(iter(sweeps.values()))["sizes"]:
        row = [f"{int(k):,}"]
        for sweep in sweeps.values():
            entry = sweep["sizes"].get(k, {})
            if entry.get("status") != "ok":
                row.append("-")
                continue
            own = entry.get("memory_bytes")
            own_text = f"{own / 1e6:.3g} MB" if own is not None else "n/a"
            row.append(f"{own_text} / {entry['rss_delta_bytes'] / 1e6:+.3g} MB")
        rows.append(row)
    return (
        "\n## Memory per compiled set (Table 10)\n\nThe library's own accounting / RSS change over the first "
        "compile (RSS is coarse: freed temporaries are reused, so small sets read as 0).\n\n"
        + _table(["K", *sweeps], rows)
    )


def decode_tables(results: dict[str, Any]) -> str:
    decode = results["decode"]
    engines: list[str] = []
    for entry in decode.values():
        engines += [name for name in entry["engines"] if name not in engines]
    peers = [name for name in engines if name != "triemask"]
    rows = []
    for k, entry in decode.items():
        times = {name: m.get("per_step_s") for name, m in entry["engines"].items()}
        rows.append(
            [f"{int(k):,}", *[_ms(times.get(name)) for name in engines]]
            + [_ratio(times.get(name), times.get("triemask")) for name in peers]
        )
    text = (
        "\n## Per-step mask cost (Table 4)\n\nOne decoding step = write the mask row + advance by the token, "
        "averaged over the same decoding paths for every engine (32 sampled values, tokenized longest-first).\n\n"
    )
    text += _table(["K", *engines, *[f"{name} / triemask" for name in peers]], rows)
    stateless = [
        f"{_ms(m['per_step_stateless_s'])} at K = {int(k):,}"
        for k, entry in decode.items()
        if "per_step_stateless_s" in (m := entry["engines"].get("triemask", {}))
    ]
    if stateless:
        text += (
            "\ntriemask through `Matcher.fill_next_token_bitmask` + `accept_token` (as xgrammar's `GrammarMatcher`); "
            f"through the stateless `fill_bitmask` + `next_state`: {', '.join(stateless)}.\n"
        )
    for k, entry in decode.items():
        for name, m in entry["engines"].items():
            if "error" in m:
                text += f"\n{name} compiles K = {int(k):,} but fails at the first decoding step: `{m['error']}`\n"
    for k, entry in decode.items():
        batched = {name: m["batch"] for name, m in entry["engines"].items() if "batch" in m}
        if not batched:
            continue
        rows = []
        for b in next(iter(batched.values())):
            fill = {name: batch[b]["fill_s"] for name, batch in batched.items()}
            step = {name: batch[b]["step_s"] for name, batch in batched.items()}
            rows.append(
                [b, *[f"{_ms(fill[name])} / {_ms(step[name])}" for name in batched]]
                + [_ratio(fill[name], fill["triemask"]) for name in batched if name != "triemask"]
            )
        text += (
            f"\n### Batch mask fill, K = {int(k):,} (Table 19)\n\nPer batch step: fill B rows / fill B rows + advance "
            "B requests, each engine through its batch API where it has one. Ratios on the fill.\n\n"
        )
        text += _table(["B", *batched, *[f"{n} / triemask" for n in batched if n != "triemask"]], rows)
    checks = []
    for k, entry in decode.items():
        for name, m in entry["engines"].items():
            if "cross_check" in m:
                check = m["cross_check"]
                checks.append([f"{int(k):,}", name, _check_cell(check)])
    text += "\n### Mask cross-check at the sampled states\n\n" + _table(["K", "engine", "disagreeing / states"], checks)
    for k, entry in decode.items():
        for name, m in entry["engines"].items():
            for example in m.get("cross_check", {}).get("examples", []):
                text += f"\n- K={k} {name}: after {example['text']!r}: only triemask {example['only_triemask']}, "
                text += f"only {name} {example['only_peer']}"
    return text + "\n"


def _check_cell(check: dict[str, Any] | None) -> str:
    """``disagreeing / checked states``, and how many of those are the peer allowing a strict subset."""
    if check is None:
        return "-"
    text = f"{check['disagreements']} / {check['states']}"
    if check["disagreements"]:
        text += f" ({check['peer_strict_subset']} subset)"
    return text


def families_table(results: dict[str, Any]) -> str:
    rows = []
    for name, entry in results["families"].items():
        c = entry["compile_s"]
        row = [name, entry["family"], f"{entry['tokens']:,}"]
        for k in ("1000", "10000"):
            row += [_ms(c["triemask"][k])]
            row += [_ratio(c[peer][k], c["triemask"][k]) for peer in ("xgrammar", "llguidance") if peer in c]
        row.append(_ms(entry.get("per_step_s")))
        row += [_check_cell(entry["cross_check"].get(peer)) for peer in ("xgrammar", "llguidance")]
        rows.append(row)
    peers = [p for p in ("xgrammar", "llguidance") if p in next(iter(results["families"].values()))["compile_s"]]
    header = ["vocabulary", "family", "tokens"]
    for k in ("1K", "10K"):
        header += [f"triemask {k}", *[f"{p} / triemask {k}" for p in peers]]
    header += ["triemask per step (1K)", "xgrammar disagreements (1K)", "llguidance disagreements (1K)"]
    return "\n## Across tokenizer families (Table 5)\n\nSynthetic tools, tokenizer prepared, median of 3.\n\n" + _table(
        header, rows
    )


def token_trie_table(results: dict[str, Any]) -> str:
    rows = []
    for k, e in results["token_trie"].items():
        rows.append(
            [
                f"{int(k):,}",
                _ms(e["triemask_s"]),
                _ms(e["token_trie_s"]),
                _ratio(e["token_trie_s"], e["triemask_s"]),
                f"{e['triemask_nodes']:,}",
                f"{e['token_trie_nodes']:,}",
                _ms(e.get("triemask_step_s")),
                _ms(e.get("token_trie_step_s")),
            ]
        )
    header = ["K", "triemask", "token trie", "token trie / triemask", "byte-trie nodes", "token-trie nodes"]
    header += ["triemask step", "token-trie step"]
    return (
        "\n## Character (byte) trie vs GENRE-style token trie (Table 2)\n\nThe token trie tokenizes every value with "
        "Qwen's own tokenizer and inserts the id sequences in a dict trie; it allows only those tokenizations.\n\n"
        + _table(header, rows)
    )


def sets_tables(results: dict[str, Any]) -> str:
    rows = []
    engines: list[str] = []
    for entry in results["sets"].values():
        engines += [name for name in entry["compile_s"] if name not in engines]
    for name, e in results["sets"].items():
        c = e["compile_s"]
        rows.append(
            [name, f"{e['k']:,}", f"{e['prefix_sharing_ratio']:.2f}", f"{e['trie_nodes']:,}", str(e["max_depth"])]
            + [_ms(c.get(engine)) for engine in engines]
            + [f"{e['memory_bytes'] / 1e6:.3g} MB"]
            + [_check_cell(e["cross_check"].get(peer)) for peer in engines if peer != "triemask"]
        )
    header = ["set", "K", "r", "trie nodes", "max depth", *[f"{e} compile" for e in engines]]
    header += ["triemask memory", *[f"{peer} disagreements" for peer in engines if peer != "triemask"]]
    text = "\n## Enum sets: prefix sharing (Table 14), compile, cross-check\n\n" + _table(header, rows)
    depth = results["sets"].get("tools-1000", {}).get("valid_by_depth")
    if depth:
        rows = [[str(d["depth"]), f"{d['mean_valid']:.1f}", str(d["max_valid"]), str(d["nodes"])] for d in depth]
        text += "\n### Valid-set size by depth, tools K = 1,000 (Table 15)\n\n"
        text += _table(["depth", "mean |valid|", "max |valid|", "nodes"], rows)
    return text


def _peer_ratio(results: dict[str, Any], k: str, peers: list[str], key: str = "compile_s") -> float | None:
    sweeps = results.get("compile", {})
    ours = sweeps.get("triemask", {}).get("sizes", {}).get(k, {})
    best = [
        sweeps[p]["sizes"][k][key] for p in peers if sweeps.get(p, {}).get("sizes", {}).get(k, {}).get("status") == "ok"
    ]
    if ours.get("status") != "ok" or not best:
        return None
    return min(best) / ours[key]


def targets(results: dict[str, Any]) -> list[tuple[str, str, float | None, float, bool | None]]:
    """(target, measured text, ratio, required, met) for the issue's targets that this run measured."""
    found: list[tuple[str, str, float | None, float, bool | None]] = []
    sweeps = results.get("compile", {})
    for k in [k for k in next(iter(sweeps.values()), {}).get("sizes", {}) if int(k) >= 10_000] if sweeps else []:
        r = _peer_ratio(results, k, ["llguidance", "llguidance-lark"])
        found.append((f"compile vs llguidance best, K={int(k):,}", "", r, 3.0, None if r is None else r >= 3))
    if "10000" in sweeps.get("triemask", {}).get("sizes", {}):
        r = _peer_ratio(results, "10000", ["xgrammar"])
        found.append(("compile vs xgrammar, K=10,000", "", r, 100.0, None if r is None else r >= 100))
    for k, entry in results.get("decode", {}).items():
        times = entry["engines"]
        if "per_step_s" in times.get("xgrammar", {}):
            r = times["xgrammar"]["per_step_s"] / times["triemask"]["per_step_s"]
            found.append((f"per-step <= xgrammar, K={int(k):,}", "", r, 1.0, r >= 1))
        for peer, need in (("xgrammar", 10.0), ("llguidance", 20.0)):
            if "128" in times["triemask"].get("batch", {}) and peer in times and "batch" in times[peer]:
                r = times[peer]["batch"]["128"]["fill_s"] / times["triemask"]["batch"]["128"]["fill_s"]
                found.append((f"batch fill B=128 vs {peer}, K={int(k):,}", "", r, need, r >= need))
    million = results.get("million", {}).get("sizes", {}).get("1000000")
    if million and million["status"] == "ok":
        found.append(("K=1,000,000 compile <= 3 s", f"{million['first_s']:.2f} s", None, 3.0, million["first_s"] <= 3))
        mb = million["memory_bytes"] / 1e6
        found.append(("K=1,000,000 memory <= 200 MB", f"{mb:.0f} MB", None, 200.0, mb <= 200))
    return found


def targets_table(results: dict[str, Any]) -> str:
    rows = []
    for name, text, ratio, need, met in targets(results):
        measured = text or ("-" if ratio is None else f"{ratio:.3g}x")
        required = f">= {need:g}x" if not text else ""
        rows.append([name, measured, required, {True: "met", False: "MISSED", None: "n/a"}[met]])
    return "\n## Targets (issue 3)\n\n" + _table(["target", "measured", "required", ""], rows)


def summary(results: dict[str, Any]) -> str:
    lines = [f"triemask benchmark ({results['run']}), {results['machine']['cpu']}, {results['machine']['cores']} cores"]
    if "compile" in results:
        header, rows = compile_rows(results, "compile_s")
        lines.append("compile (prepared): " + " | ".join(header))
        lines += ["  " + " | ".join(row) for row in rows]
    if "decode" in results:
        for k, entry in results["decode"].items():
            ours = entry["engines"]["triemask"]
            for name, m in entry["engines"].items():
                if "error" in m:
                    lines.append(f"K={int(k):,} {name:16s} fails to decode: {m['error']}")
                    continue
                step = m["per_step_s"]
                line = f"K={int(k):,} {name:16s} per-step {_ms(step):>9s} ({_ratio(step, ours['per_step_s'])})"
                if "128" in m.get("batch", {}):
                    fill, mine = m["batch"]["128"]["fill_s"], ours["batch"]["128"]["fill_s"]
                    line += f"  batch B=128 fill {_ms(fill):>9s} ({_ratio(fill, mine)})"
                if "cross_check" in m:
                    line += f"  disagreements {m['cross_check']['disagreements']}/{m['cross_check']['states']}"
                lines.append(line)
    for name, text, ratio, _, met in targets(results):
        measured = text or ("-" if ratio is None else f"{ratio:.3g}x")
        lines.append(f"target {name}: {measured} ({'met' if met else 'MISSED' if met is False else 'n/a'})")
    return "\n".join(lines)


def _line_plot(
    path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]], limits: bool = False
) -> None:
    """One log-log figure with a line per engine (and the provider limits, on compile plots)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for engine, points in series.items():
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=engine)
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    if limits:
        for label, k in PROVIDER_LIMITS.items():
            ax.axvline(k, linestyle=":", color="grey")
            ax.text(k, ax.get_ylim()[1], label, rotation=90, va="top", ha="right", fontsize=7, color="grey")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(results: dict[str, Any], out: Path, name: str) -> None:
    """compile time vs K (log-log, provider limits), per-step vs K, batch fill vs B."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plots (pip install -e '.[bench]')")
        return
    matplotlib.use("Agg")
    if "compile" in results:
        series = {
            engine: [(int(k), e["compile_s"]) for k, e in sweep["sizes"].items() if e["status"] == "ok"]
            for engine, sweep in results["compile"].items()
        }
        title = f"Compile time vs K ({results['vocabulary']}, synthetic tools)"
        _line_plot(out / f"{name}-compile.png", title, "K (values)", "compile time (s)", series, limits=True)
    if "decode" in results:
        decode = results["decode"]
        engines = list(dict.fromkeys(n for e in decode.values() for n in e["engines"]))
        series = {
            engine: [
                (int(k), e["engines"][engine]["per_step_s"] * 1e6)
                for k, e in decode.items()
                if "per_step_s" in e["engines"].get(engine, {})
            ]
            for engine in engines
        }
        _line_plot(out / f"{name}-per-step.png", "Per-step mask + advance", "K (values)", "per step (µs)", series)
        for k, entry in decode.items():
            batched = {n: m["batch"] for n, m in entry["engines"].items() if "batch" in m}
            if not batched or len(next(iter(batched.values()))) < 2:
                continue
            series = {n: [(int(b), x["fill_s"] * 1e6) for b, x in batch.items()] for n, batch in batched.items()}
            title = f"Batch mask fill, K = {int(k):,}"
            _line_plot(out / f"{name}-batch-{k}.png", title, "batch size B", "fill per batch step (µs)", series)
