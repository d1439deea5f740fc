"""The template K gives llama-server on a model without tools of its own: chatapp's teaching, word for word.

The workload is built on the tiny model with no template (chatapp's fallback teaches the tools),
with a Qwen3-style one (its own tools: llama-server keeps the model's template) and with Gemma 2's
(no tools, turns that are not ChatML's: the template would write another prompt, so none is given).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from chatapp.benchmark.anthropic_client import MESSAGES_PATH, anthropic_body
from chatapp.benchmark.llama_server import LlamaServerPeer, default_llama_server_path
from chatapp.benchmark.tool_template import HERMES_CHATML_TEMPLATE, server_template_for
from chatapp.benchmark.workloads import CODER_NAME, SCALES, Workload, build_workloads
from chatapp.engine.llama_native import NativeModel
from chatapp.engine.opening import open_prompt_builder
from chatapp.prompting.chat_template import ChatTemplate
from chatapp.prompting.prompt import PromptBuilder
from chatapp.prompting.tool_blocks import HermesToolFormat
from tests.model_factory import write_tiny_llama

JSON = {"Content-Type": "application/json"}
TEMPLATES = Path(__file__).parents[1] / "prompting" / "templates"


@pytest.fixture(scope="module")
def untaught_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("untaught") / "tiny.gguf")


@pytest.fixture(scope="module")
def coder(untaught_model: Path) -> Workload:
    (workload,) = build_workloads(untaught_model, SCALES["tiny"], (CODER_NAME,))
    return workload


def test_the_template_writes_every_request_as_chatapps_own_prompt(untaught_model: Path, coder: Workload) -> None:
    assert coder.server_template == HERMES_CHATML_TEMPLATE, "a model without tools: llama-server is taught them"
    vocabulary = NativeModel(untaught_model, vocab_only=True)
    try:
        template = ChatTemplate(
            HERMES_CHATML_TEMPLATE,
            vocabulary.token_text(vocabulary.bos_id),
            vocabulary.token_text(vocabulary.eos_id),
        )
        builder = PromptBuilder(template, vocabulary)
        assert isinstance(builder.tool_format, HermesToolFormat), "the calls in it are found as Hermes'"
        assert builder.native_tools, "it renders the tools itself"
        for request in coder.requests:
            rendered = builder.with_tools(request.tools).build(list(request.messages))
            # The same text (the tokens may split otherwise where chatapp tokenizes message by message).
            assert vocabulary.detokenize(rendered, special=True) == vocabulary.detokenize(
                list(request.tokens), special=True
            ), request.label
    finally:
        vocabulary.close()


@pytest.mark.parametrize("template", ["qwen3_style.jinja", "gemma2.jinja"])
def test_a_model_with_its_own_tools_or_other_turns_keeps_its_template(tmp_path: Path, template: str) -> None:
    model = write_tiny_llama(tmp_path / "model.gguf", chat_template=(TEMPLATES / template).read_text())
    (workload,) = build_workloads(model, SCALES["tiny"], (CODER_NAME,))
    assert workload.server_template is None
    builder = open_prompt_builder(model)
    try:
        assert builder.native_tools == (template == "qwen3_style.jinja")
        assert server_template_for(builder, workload.requests) is None
    finally:
        builder.close()


@pytest.mark.slow
def test_llama_server_given_the_template_computes_chatapps_prompt(
    coder: Workload, untaught_model: Path, tmp_path: Path
) -> None:
    binary = default_llama_server_path()
    if not binary.is_file():
        pytest.skip("llama-server not built: run tools/build_llama_server.py")
    template = tmp_path / "chat_template.jinja"
    template.write_text(HERMES_CHATML_TEMPLATE, encoding="utf-8")
    request = coder.requests[-1]
    body = json.dumps(anthropic_body(request, 24)).encode()
    counted = {}
    for name, given in (("own", None), ("taught", template)):
        with LlamaServerPeer(
            binary, untaught_model, context=coder.context, threads=2, cache_ram_mib=0, chat_template_file=given
        ) as server:
            asked = urllib.request.Request(f"{server.base_url}{MESSAGES_PATH}/count_tokens", body, JSON)
            with urllib.request.urlopen(asked, timeout=60) as response:
                counted[name] = json.loads(response.read())["input_tokens"]
    # Its own (ChatML) drops the tools and the calls; given the template, it writes chatapp's prompt: the
    # same text, within a few tokens (they split otherwise where chatapp tokenizes message by message).
    assert len(request.tokens) - counted["own"] > len(request.tokens) // 10
    assert abs(counted["taught"] - len(request.tokens)) <= len(request.tokens) // 100
