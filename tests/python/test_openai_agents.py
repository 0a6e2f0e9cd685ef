"""What agents, extraction pipelines and sampling apps send, through the official SDK.

Structured output: JSON-schema replies are validated with the `jsonschema` package, greedy and
under temperature-1 sampling; json_object replies parse as objects; unsupported schema keywords
are 400s naming the schema path. Tool calling: the round trip, streamed and whole. n > 1 and
prompt lists: reproducible, distinct samples, the prompt prefilled once. logit_bias, the
developer role, X-Request-Id. The pool is whole afterwards.
"""

from __future__ import annotations

import json

import pytest

from daemon_harness import Daemon, binary_path, model_path

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")


@pytest.fixture(autouse=True, scope="module")
def _binary_and_model():
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")


@pytest.fixture(scope="module")
def daemon():
    with Daemon() as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon):
    c = openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0,
                      timeout=120)
    yield c
    c.close()



# A corpus of schemas as applications write them: nested objects, arrays, enums, optional
# fields, numeric bounds, a $defs reference, anyOf with null. Strings are bounded so that a
# temperature-1 sample ends within max_tokens (an unbounded string may run until the limit).
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "maxLength": 32},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "status": {"enum": ["pending", "shipped", "delivered"]},
            "items": {
                "type": "array", "minItems": 1, "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "maxLength": 12},
                                   "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
                                   "price": {"type": "number", "minimum": 0, "maximum": 1000}},
                    "required": ["sku", "quantity", "price"],
                },
            },
            "gift": {"type": "boolean"},
        },
        "required": ["status", "items"],
    },
    "weather": {
        "$defs": {"reading": {"type": "object",
                              "properties": {"celsius": {"type": "number", "minimum": -90,
                                                         "maximum": 60},
                                             "note": {"anyOf": [{"type": "string",
                                                                 "maxLength": 20},
                                                                {"type": "null"}]}},
                              "required": ["celsius", "note"]}},
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20},
                       "today": {"$ref": "#/$defs/reading"},
                       "tomorrow": {"$ref": "#/$defs/reading"}},
        "required": ["city", "today", "tomorrow"],
    },
    "tags": {
        "type": "array", "maxItems": 4,
        "items": {"type": "string", "minLength": 1, "maxLength": 10},
    },
}


def ask(client, model, schema_name, temperature, seed=None, stream=False):
    kwargs = dict(
        model=model,
        messages=[{"role": "user", "content": f"Give an example {schema_name} as JSON."}],
        max_tokens=300, temperature=temperature, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": schema_name, "strict": True,
                                         "schema": SCHEMAS[schema_name]}})
    if not stream:
        out = client.chat.completions.create(**kwargs)
        return out.choices[0].message.content, out.choices[0].finish_reason
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, [c.choices[0].finish_reason for c in chunks if c.choices][-1]


@pytest.fixture(scope="module")
def model(client):
    (m,) = client.models.list().data
    return m.id


@pytest.mark.parametrize("schema_name", sorted(SCHEMAS))
def test_json_schema_replies_validate_greedy_and_sampled(daemon, client, model, schema_name):
    for temperature, seed in [(0.0, None), (1.0, 1), (1.0, 2)]:
        text, finish = ask(client, model, schema_name, temperature, seed)
        assert finish == "stop", (temperature, seed, text)
        jsonschema.validate(json.loads(text), SCHEMAS[schema_name])
    # Streamed: the deltas join into the same reply.
    streamed, finish = ask(client, model, schema_name, 1.0, 1, stream=True)
    assert streamed == ask(client, model, schema_name, 1.0, 1)[0] and finish == "stop"
    daemon.wait_pool_free()


def test_sdk_parse_with_a_pydantic_model(client, model):
    # The SDK's own structured-output path: the model class becomes a strict json_schema
    # (pydantic's $defs, $ref, titles, additionalProperties: false) and the reply is parsed back.
    class Step(pydantic.BaseModel):
        explanation: str = pydantic.Field(max_length=40)
        output: int

    class Solution(pydantic.BaseModel):
        steps: list[Step] = pydantic.Field(max_length=3)
        answer: int

    out = client.chat.completions.parse(
        model=model, max_tokens=400, temperature=0,
        messages=[{"role": "system", "content": "Solve step by step, briefly."},
                  {"role": "user", "content": "What is 3 + 4 * 2?"}],
        response_format=Solution)
    assert isinstance(out.choices[0].message.parsed, Solution)


def test_json_object_mode(client, model):
    out = client.chat.completions.create(
        model=model, max_tokens=200, temperature=0,
        messages=[{"role": "user", "content": "Give a JSON object with two keys, name and colour, for a cat."}],
        response_format={"type": "json_object"})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


def test_completions_endpoint_takes_response_format_too(client, model):
    out = client.completions.create(
        model=model, prompt="A JSON list of two fruits:", max_tokens=60, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {
            "name": "fruits", "schema": SCHEMAS["tags"]}}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), SCHEMAS["tags"])


@pytest.mark.parametrize("response_format,extra,param,needle", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}}}, {},
     "response_format.json_schema.schema", "properties.a.pattern"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
     {}, "response_format.json_schema.schema", "does not resolve"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, {},
     "response_format.json_schema.schema", "is required"),
    ({"type": "yaml"}, {}, "response_format.type", "json_schema"),
    ({"type": "json_object"}, {"ignore_eos": True}, "response_format", "ignore_eos"),
])
def test_bad_response_formats_are_400_naming_the_field(daemon, response_format, extra, param,
                                                       needle):
    import urllib.request
    import urllib.error
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": response_format, **extra}
    req = urllib.request.Request(daemon.http_url + "/v1/chat/completions", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    out = json.loads(err.value.read())
    assert err.value.code == 400, out
    assert out["error"]["param"] == param and needle in out["error"]["message"], out


def test_logit_bias_bans_and_forces_tokens(daemon, client, model):
    prompt = "The capital of France is"
    base = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                     logprobs=1)
    first = base.choices[0].text
    (first_id,) = daemon.client.tokenize(first, add_special_tokens=False)
    banned = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(first_id): -100})
    assert banned.choices[0].text != first
    forced_id = daemon.client.tokenize(" banana", add_special_tokens=False)[0]
    forced = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(forced_id): 100})
    assert daemon.client.tokenize(forced.choices[0].text, add_special_tokens=False) == [forced_id]
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=prompt, max_tokens=1,
                                  logit_bias={"99999999": 1})
    assert err.value.body["param"] == "logit_bias[99999999]"


def test_developer_role_and_client_request_id(daemon, client, model):
    def chat(role):
        return client.chat.completions.create(
            model=model, max_tokens=8, temperature=0,
            messages=[{"role": role, "content": "Answer in French."},
                      {"role": "user", "content": "Hello"}]).choices[0].message.content
    assert chat("developer") == chat("system")
    raw = client.chat.completions.with_raw_response.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"X-Request-Id": "trace-42"})
    assert raw.headers["x-request-id"] == "trace-42"
    assert raw.parse().id.endswith("trace-42")
    daemon.wait_pool_free()


# ------------------------------------------------------------------------------------------
# Tool calling: the SDK's round trip (call -> tool result -> answer), whole and streamed.

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {"name": "current_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def check_calls(calls, allowed=("get_weather", "current_time")):
    assert calls, "no tool call"
    schemas = {t["function"]["name"]: t["function"]["parameters"]
               for t in (WEATHER_TOOL, TIME_TOOL)}
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_tool_call_round_trip(daemon, client, model):
    # One call (the 135M model, offered parallel calls, keeps calling until max_tokens).
    out = client.chat.completions.create(model=model, messages=ASK, temperature=0,
                                         max_tokens=120, tools=[WEATHER_TOOL, TIME_TOOL],
                                         tool_choice="required", parallel_tool_calls=False)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    check_calls(choice.message.tool_calls)
    # The call and its result go back through the template; the model answers in text.
    history = ASK + [choice.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"celsius": 21, "sky": "clear"})}
        for call in choice.message.tool_calls]
    answer = client.chat.completions.create(model=model, messages=history, temperature=0,
                                            max_tokens=40, tools=[WEATHER_TOOL, TIME_TOOL],
                                            tool_choice="none")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    daemon.wait_pool_free()


def test_tool_calls_streamed_equal_whole(client, model):
    # Parallel calls, cut by max_tokens: the complete calls are the same either way.
    kwargs = dict(model=model, messages=ASK, temperature=0, max_tokens=60,
                  tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    out = client.chat.completions.create(**kwargs).choices[0]
    whole = out.message.tool_calls
    check_calls(whole)
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert finish == out.finish_reason
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.function.name, c.function.arguments) for c in whole]


def test_named_tool_choice_and_no_parallel_calls(client, model):
    out = client.chat.completions.create(
        model=model, messages=ASK, temperature=1, seed=3, max_tokens=120,
        tools=[WEATHER_TOOL, TIME_TOOL], parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = out.choices[0].message.tool_calls
    assert len(calls) == 1
    check_calls(calls, allowed=("get_weather",))


def test_auto_tool_choice_answers_or_calls(client, model):
    out = client.chat.completions.create(model=model, messages=ASK, temperature=0,
                                         max_tokens=60, tools=[WEATHER_TOOL])
    message = out.choices[0].message
    if message.tool_calls:
        assert out.choices[0].finish_reason == "tool_calls"
        check_calls(message.tool_calls)
    else:
        assert message.content and "<tool_call>" not in message.content


@pytest.mark.parametrize("body,param", [
    ({"tools": [WEATHER_TOOL], "tool_choice": "set_alarm"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"functions": [WEATHER_TOOL["function"]]}, "functions"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                          "function": {"name": "get_weather", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].arguments"),
])
def test_bad_tool_requests_are_400_naming_the_field(daemon, model, body, param):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(
        daemon.http_url + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": model, "messages": ASK, "max_tokens": 4, **body}).encode(),
        headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    out = json.loads(err.value.read())
    assert err.value.code == 400 and out["error"]["param"] == param, out


# ------------------------------------------------------------------------------------------
# n > 1 and lists of prompts

STORY = [{"role": "user", "content": "Tell me a one-line story about a fox."}]


def test_n_choices_are_reproducible_distinct_and_share_the_prefill(daemon, client, model):
    long_story = [{"role": "system", "content": "You are a storyteller. " * 20}] + STORY
    hits = daemon.metric("winnow_prefix_cache_hits_total")
    kwargs = dict(model=model, messages=long_story, n=4, seed=11, temperature=1.0,
                  max_tokens=16)
    out = client.chat.completions.create(**kwargs)
    shared = daemon.metric("winnow_prefix_cache_hits_total") - hits
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) == 4, texts
    assert [c.message.content for c in client.chat.completions.create(**kwargs).choices] == texts
    # The prompt is counted once, and the three later choices attached its cached blocks.
    single = client.chat.completions.create(**{**kwargs, "n": 1})
    assert out.usage.prompt_tokens == single.usage.prompt_tokens
    assert out.usage.completion_tokens >= 4
    assert shared >= 3 * 16 * ((out.usage.prompt_tokens - 1) // 16), shared
    # Choice j of a seeded request is the single request with seed + j.
    third = client.chat.completions.create(**{**kwargs, "n": 1, "seed": 13})
    assert third.choices[0].message.content == texts[2]
    daemon.wait_pool_free()


def test_n_choices_streamed_equal_whole(client, model):
    kwargs = dict(model=model, messages=STORY, n=3, seed=5, temperature=1.0, max_tokens=12)
    whole = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    texts, finishes = {}, {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [texts[i] for i in range(3)] == whole
    assert sorted(finishes) == [0, 1, 2]


def test_a_list_of_prompts_gives_n_choices_each(client, model):
    prompts = ["The capital of France is", "Once upon a time"]
    out = client.completions.create(model=model, prompt=prompts, n=2, seed=3, temperature=1.0,
                                    max_tokens=8)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for i, choice in enumerate(out.choices):
        alone = client.completions.create(model=model, prompt=prompts[i // 2], seed=3 + i % 2,
                                          temperature=1.0, max_tokens=8)
        assert choice.text == alone.choices[0].text, i


# ------------------------------------------------------------------------------------------
# echo with prompt log-probabilities (what loglikelihood evaluations send)

def test_echo_logprobs_equal_winnow_score(daemon, client, model, tmp_path):
    import subprocess

    from daemon_harness import binary_path, model_path
    text = "The quick brown fox jumps over the lazy dog because it was late for dinner."
    ids = daemon.client.tokenize(text)
    out = client.completions.create(model=model, prompt=text, echo=True, max_tokens=0,
                                    logprobs=2, temperature=0)
    choice = out.choices[0]
    assert choice.text == text and out.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert len(lp.tokens) == len(ids)
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    (tmp_path / "ids.json").write_text(json.dumps(ids))
    scored = json.loads(subprocess.run(
        [str(binary_path()), "score", "--model", str(model_path()), "--tokens-file",
         str(tmp_path / "ids.json")], capture_output=True, text=True, check=True).stdout)
    for got, want in zip(lp.token_logprobs[1:], scored["logprob_next"], strict=True):
        assert abs(got - want) < 2e-3, (got, want)
    # With a completion: the prompt's tokens, then the generated ones, offsets running on.
    more = client.completions.create(model=model, prompt=text, echo=True, max_tokens=4,
                                     logprobs=0, temperature=0)
    c = more.choices[0]
    assert c.text.startswith(text) and len(c.logprobs.tokens) == len(ids) + 4
    assert c.logprobs.token_logprobs[1:len(ids)] == lp.token_logprobs[1:]
    assert c.logprobs.text_offset == sorted(c.logprobs.text_offset)
    # Streamed: the prompt comes first, in one chunk.
    chunks = list(client.completions.create(model=model, prompt=text, echo=True, max_tokens=4,
                                            temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    assert chunks[0].choices[0].text == text
    daemon.wait_pool_free()


def test_echo_is_refused_on_chat_and_suffix_says_why(daemon, model):
    import urllib.error
    import urllib.request
    for path, body, param in [
            ("/v1/chat/completions", {"messages": ASK, "echo": True}, "echo"),
            ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix")]:
        req = urllib.request.Request(daemon.http_url + path, method="POST",
                                     data=json.dumps({"model": model, **body}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=60)
        out = json.loads(err.value.read())
        assert err.value.code == 400 and out["error"]["param"] == param, out
