"""The OpenAI-compatible HTTP API of `winnow serve`, driven by real clients.

The official `openai` package for completions and chat, streamed and not; curl for the SSE
framing on the wire; raw sockets for a client that disconnects mid-stream. Outputs are checked
against the gRPC API on the same daemon (greedy decoding must agree token for token), and the
pool against GetServerStatus after every cancel.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from daemon_harness import Daemon, binary_path, model_path

openai = pytest.importorskip("openai")

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(autouse=True, scope="module")
def _binary_and_model():
    if not binary_path().exists() or not model_path().exists():
        pytest.fail(f"need {binary_path()} and {model_path()} (make build model)")


@pytest.fixture(scope="module")
def daemon():
    # A pool of 1500 blocks (50 per layer: 800 tokens a sequence) makes "too long" reachable.
    with Daemon("--max-prompt-tokens", "512", "--max-batched-tokens", "128",
                "--kv-blocks", "1500") as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon):
    c = openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0,
                      timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def model_name(client):
    (model,) = client.models.list().data
    return model.id


def http(daemon, method: str, path: str, body=None, raw: bytes | None = None):
    """(status, parsed JSON or text) of one request, without raising on 4xx/5xx."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(daemon.http_url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def grpc_greedy(daemon, max_tokens: int, **kwargs):
    text, ids, final = daemon.client.generate_text(max_tokens=max_tokens, temperature=0.0,
                                                   timeout=120, **kwargs)
    return text, ids, final


# ------------------------------------------------------------------------------------------
# The SDK, streamed and not


def test_models_health_and_served_name(daemon, client, model_name):
    assert model_name == daemon.client.model_info().name  # default: the GGUF's general.name
    status, _ = http(daemon, "GET", "/health")
    assert status == 200


def test_completion_matches_grpc(daemon, client, model_name):
    text, ids, _ = grpc_greedy(daemon, 8, prompt=PROMPT, ignore_eos=True)
    out = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    (choice,) = out.choices
    assert choice.text == text and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 8 == len(ids)
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8
    # The prefix cache: a second identical prompt reuses full blocks (none for 5 tokens here).
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert out.object == "text_completion" and out.model == model_name

    # Token ids as the prompt give the same tokens.
    prompt_ids = daemon.client.tokenize(PROMPT)
    out = client.completions.create(model=model_name, prompt=prompt_ids, max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == text


def test_completion_stream_with_logprobs(daemon, client, model_name):
    whole = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6,
                                      temperature=0, logprobs=2)
    chunks = list(client.completions.create(model=model_name, prompt=PROMPT, max_tokens=6,
                                            temperature=0, logprobs=2, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == whole.usage.completion_tokens
    assert all(len(top) == 2 for top in lp.top_logprobs)
    # Greedy: the chosen token is the most likely one.
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and abs(max(top.values()) - logprob) < 1e-4
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens


def test_chat_streamed_and_not(daemon, client, model_name):
    text, _, final = grpc_greedy(daemon, 12, chat=[(m["role"], m["content"]) for m in CHAT])
    out = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=12,
                                         temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == text
    assert out.usage.completion_tokens == final.usage.completion_tokens

    stream = client.chat.completions.create(model=model_name, messages=CHAT,
                                            max_completion_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == out.choices[0].finish_reason and all(f is None for f in finish[:-1])
    # include_usage: one last chunk without choices carries the usage; the others have none.
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == out.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_logprobs_and_seeded_sampling(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=5,
                                         temperature=0, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(c.top_logprobs) == 3 and c.bytes is not None for c in content)
    kwargs = dict(model=model_name, messages=CHAT, max_tokens=8, temperature=0.9, top_p=0.95,
                  seed=7, presence_penalty=0.5, frequency_penalty=0.2,
                  extra_body={"top_k": 40, "min_p": 0.01, "repetition_penalty": 1.1})
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_kv_compression_extension(daemon, client, model_name):
    long_prompt = "Notes: " + " ".join(f"item {i} is blue." for i in range(60)) + " Summary:"
    out = client.completions.create(model=model_name, prompt=long_prompt, max_tokens=4,
                                    temperature=0,
                                    extra_body={"kv_compression": {"policy": "snapkv",
                                                                   "budget": 0.5,
                                                                   "params": {"window": 8}}})
    assert out.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2,
                                  extra_body={"kv_compression": {"policy": "lz77",
                                                                 "budget": 0.5}})
    assert err.value.body["param"] == "kv_compression.policy"
    assert "unknown policy 'lz77'" in err.value.body["message"]
    daemon.wait_pool_free()


def test_kv_compression_of_a_context_alone(daemon, client, model_name):
    # The system prompt and the document (the first two messages) are compressed before the
    # question is computed, under any question.
    document = "Notes: " + " ".join(f"item {i} is blue." for i in range(60))
    scope = {"policy": "snapkv", "budget": 0.3, "scope": "context", "context_messages": 2}
    hits = daemon.metric("winnow_compressed_prefix_hits_total")

    def ask(question, salt):
        return client.chat.completions.create(
            model=model_name, max_tokens=6, temperature=0,
            messages=[{"role": "system", "content": "Answer from the notes."},
                      {"role": "user", "content": document},
                      {"role": "user", "content": question}],
            extra_body={"kv_compression": scope, "cache_salt": salt})

    # The first question publishes the compressed context; the second attaches it and answers
    # as it does when it compresses the context itself (under a salt of its own).
    first = ask("What colour is item 7?", "context test")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    attached = ask("How many items are there?", "context test")
    alone = ask("How many items are there?", "context test, alone")
    context_tokens = attached.usage.prompt_tokens_details.cached_tokens
    assert 0 < context_tokens < attached.usage.prompt_tokens
    assert alone.usage.prompt_tokens_details.cached_tokens == 0
    assert attached.choices[0].message.content == alone.choices[0].message.content
    assert daemon.metric("winnow_compressed_prefix_hits_total") - hits == context_tokens
    assert daemon.metric("winnow_compressed_prefix_contexts") >= 2
    with pytest.raises(openai.BadRequestError) as err:  # more messages than the chat has
        client.chat.completions.create(
            model=model_name, max_tokens=2, messages=[{"role": "user", "content": document}],
            extra_body={"kv_compression": scope})
    assert err.value.body["param"] == "kv_compression.context_messages"
    with pytest.raises(openai.BadRequestError) as err:  # evicts while decoding
        client.completions.create(
            model=model_name, prompt=document + " Question: which item is red?", max_tokens=2,
            extra_body={"kv_compression": {"policy": "streaming_llm", "budget": 0.3,
                                           "scope": "context", "context_tokens": 64}})
    assert "context_tokens" in err.value.body["message"]
    daemon.wait_pool_free()


def test_kv_compression_of_a_chat_history(daemon, client, model_name):
    # A chat sent turn after turn with scope "history": each turn compresses its history's
    # whole stages (every message but the last) and publishes them; the next turn attaches the
    # stages it shares and compresses only the new ones, answering as a turn that compressed its
    # whole history itself does.
    history = {"policy": "kvzip", "budget": 0.3, "scope": "history", "stage_tokens": 32,
               "probe": "repeat"}
    chat = [{"role": "system", "content": "You keep track of the user's notes."},
            {"role": "user", "content": "Note: " + " ".join(f"box {i} holds {i * 7} coins."
                                                            for i in range(12))},
            {"role": "assistant", "content": "Noted the twelve boxes."}]

    def turn(question, salt):
        return client.chat.completions.create(
            model=model_name, max_tokens=6, temperature=0,
            messages=chat + [{"role": "user", "content": question}],
            extra_body={"kv_compression": history, "cache_salt": salt})

    first = turn("How many coins in box 3?", "history test")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    chat.append({"role": "user", "content": "How many coins in box 3?"})
    chat.append({"role": "assistant", "content": first.choices[0].message.content})
    second = turn("And in box 5?", "history test")
    alone = turn("And in box 5?", "history test, alone")
    attached = second.usage.prompt_tokens_details.cached_tokens
    # The first turn's history stages, attached: a whole number of them.
    assert attached > 0 and attached % 32 == 0
    assert attached < first.usage.prompt_tokens
    assert alone.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].message.content == alone.choices[0].message.content
    for bad, param in (({**history, "scope": "context", "context_messages": 1},
                        "kv_compression.stage_tokens"),
                       ({**history, "policy": "vl_cache", "probe": "none"},
                        "kv_compression.scope")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model_name, max_tokens=2,
                                           messages=chat + [{"role": "user", "content": "?"}],
                                           extra_body={"kv_compression": bad})
        assert err.value.body["param"] == param, err.value.body
    daemon.wait_pool_free()


def test_kv_compression_probe(daemon, client, model_name):
    # A context scored with the repeat probe: the request runs; the probe is refused where it
    # cannot apply, naming the field.
    document = "Notes: " + " ".join(f"item {i} is green." for i in range(40))
    chat = [{"role": "user", "content": document}, {"role": "user", "content": "Item 3?"}]
    probe = {"policy": "snapkv", "budget": 0.3, "scope": "context", "context_messages": 1,
             "probe": "repeat"}
    out = client.chat.completions.create(model=model_name, max_tokens=3, temperature=0,
                                         messages=chat, extra_body={"kv_compression": probe})
    assert out.usage.completion_tokens >= 1
    for bad, why in (({**probe, "scope": "prompt", "context_messages": 0}, "scope"),
                     ({**probe, "probe": "echo"}, "repeat"),
                     ({**probe, "policy": "vl_cache"}, "cannot score")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model_name, max_tokens=2, messages=chat,
                                           extra_body={"kv_compression": bad})
        assert err.value.body["param"] == "kv_compression.probe", err.value.body
        assert why in err.value.body["message"]
    daemon.wait_pool_free()


# ------------------------------------------------------------------------------------------
# The wire: SSE framing, concurrency, disconnects


def test_curl_sse_framing(daemon, model_name):
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl not found (scripts/install-deps.sh installs it)")
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    p = subprocess.run([curl, "-sS", "-N", "-D", "-", "-H", "Content-Type: application/json",
                        "-d", json.dumps(body), daemon.http_url + "/v1/completions"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    head, _, payload = p.stdout.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200")
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in head.split("\r\n")[1:])}
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["transfer-encoding"] == "chunked"
    # Every event is one "data: ..." line and a blank line; comments (": ...") may come between.
    assert payload.endswith("data: [DONE]\n\n")
    events = [e for e in payload.split("\n\n") if e]
    data = [e for e in events if not e.startswith(":")]
    assert all(e.startswith("data: ") and "\n" not in e for e in data), events
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in data[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_concurrent_streams_match_one_at_a_time(daemon, model_name):
    prompts = [f"Story {i}: " + "the quick brown fox " * (1 + 3 * i) for i in range(8)]
    c = openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0,
                      timeout=120)

    def run(prompt):
        stream = c.completions.create(model=model_name, prompt=prompt, max_tokens=6,
                                      temperature=0, stream=True,
                                      extra_body={"ignore_eos": True})
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    solo = [run(p) for p in prompts]
    barrier = threading.Barrier(len(prompts))

    def together(prompt):
        barrier.wait()
        return run(prompt)

    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(together, p) for p in prompts]
        # /health stays quick while every stream holds a connection (readiness must not flap).
        slowest = 0.0
        while not all(f.done() for f in futures):
            t0 = time.monotonic()
            assert http(daemon, "GET", "/health")[0] == 200
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)
        concurrent = [f.result() for f in futures]
    c.close()
    assert concurrent == solo
    assert slowest < 1.0, slowest
    daemon.wait_pool_free()


def _open_stream(daemon, body: dict) -> socket.socket:
    """Sends a streaming request on a raw socket and returns it after the first event."""
    sock = socket.create_connection(("127.0.0.1", daemon.http_port), timeout=60)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    received = b""
    while b"data: {" not in received:
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    return sock


def test_disconnect_while_waiting_for_a_whole_response_frees_blocks(daemon, model_name):
    before = daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"})
    sock = socket.create_connection(("127.0.0.1", daemon.http_port), timeout=60)
    data = json.dumps({"model": model_name, "prompt": PROMPT, "max_tokens": 400,
                       "ignore_eos": True, "temperature": 0}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 + f"\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    deadline = time.monotonic() + 30
    while daemon.client.server_status().running == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sock.close()
    daemon.wait_pool_free(timeout=15)
    assert daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"}) == before + 1


def test_disconnect_mid_stream_frees_blocks(daemon, model_name):
    before = daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"})
    sock = _open_stream(daemon, {"model": model_name, "prompt": PROMPT, "max_tokens": 400,
                                 "ignore_eos": True, "temperature": 0, "stream": True})
    assert daemon.client.server_status().running >= 1
    sock.close()
    daemon.wait_pool_free(timeout=15)
    st = daemon.client.server_status()
    assert st.kv_blocks_free == st.kv_blocks_total
    assert daemon.metric("winnow_requests_finished_total", {"reason": "cancelled"}) == before + 1


# ------------------------------------------------------------------------------------------
# Errors: OpenAI's error body, the status, and the field named as sent


@pytest.mark.parametrize("body,param,needle", [
    ({"prompt": PROMPT, "temperature": -1}, "temperature", "temperature = -1"),
    ({"prompt": PROMPT, "temperature": "hot"}, "temperature", "must be a number"),
    ({"prompt": PROMPT, "n": 17}, "n", "[1, 16]"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", "must be >= 1"),
    ({"prompt": PROMPT, "max_tokens": 100000}, "max_tokens", "--max-tokens-limit"),
    ({"prompt": PROMPT, "stop": ["ok", ""]}, "stop[1]", "must not be empty"),
    ({"prompt": PROMPT, "top_p": 0}, "top_p", "top_p"),
    ({"prompt": PROMPT, "logprobs": 21}, "logprobs", "[0, 20]"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": ["a", 5]}, "prompt[1]", "a string or a list of token ids"),
    ({"prompt": [1, 2, 999999]}, "prompt[2]", "outside the vocabulary"),
    ({}, "prompt", "is required"),
])
def test_completion_bad_fields_are_400(daemon, model_name, body, param, needle):
    status, out = http(daemon, "POST", "/v1/completions", {"model": model_name, **body})
    assert status == 400, out
    err = out["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["message"].startswith(param) and needle in err["message"], err


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].type"),
    ({"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs"),
    ({"messages": CHAT, "top_logprobs": 30, "logprobs": True}, "top_logprobs"),
])
def test_chat_bad_fields_are_400(daemon, model_name, body, param):
    status, out = http(daemon, "POST", "/v1/chat/completions", {"model": model_name, **body})
    assert status == 400 and out["error"]["param"] == param, out


def test_other_errors(daemon, client, model_name):
    status, out = http(daemon, "POST", "/v1/completions", raw=b"{not json")
    assert status == 400 and out["error"]["type"] == "invalid_request_error"
    # Unknown model: 404, as the SDK expects.
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-nothing", prompt=PROMPT, max_tokens=1)
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_found"
    # Too long: a prompt over --max-prompt-tokens, and prompt + max_tokens beyond the context.
    status, out = http(daemon, "POST", "/v1/completions",
                       {"prompt": "word " * 700, "max_tokens": 1})
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out
    status, out = http(daemon, "POST", "/v1/completions",
                       {"prompt": PROMPT, "max_tokens": 1000})
    assert status == 400 and "KV blocks" in out["error"]["message"], out
    # Deeply nested JSON is refused, not a crash.
    status, out = http(daemon, "POST", "/v1/completions",
                       raw=b'{"prompt": ' + b"[" * 200000 + b"]" * 200000 + b"}")
    assert status == 400 and out["error"]["param"] == "prompt[0]", out
    # cpp-httplib caps form-encoded bodies (curl -d's default type) at 8 KiB; the error says so.
    req = urllib.request.Request(daemon.http_url + "/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "x " * 9000}).encode(),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as form:
        urllib.request.urlopen(req, timeout=30)
    assert form.value.code == 413 and b"application/json" in form.value.read()
    status, out = http(daemon, "GET", "/v1/nothing")
    assert status == 404 and "error" in out
    # Rejections are counted under the gRPC code names.
    assert daemon.metric("winnow_requests_rejected_total", {"code": "NOT_FOUND"}) >= 1
    daemon.wait_pool_free()


def test_tokenize_detokenize(daemon, model_name):
    status, out = http(daemon, "POST", "/tokenize", {"model": model_name, "prompt": PROMPT})
    assert status == 200 and out["tokens"] == daemon.client.tokenize(PROMPT)
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] > 0
    status, chat = http(daemon, "POST", "/tokenize", {"messages": CHAT})
    assert status == 200 and chat["count"] > len(CHAT[0]["content"].split())
    ids = out["tokens"]
    status, out = http(daemon, "POST", "/detokenize", {"tokens": ids})
    assert status == 200 and out["prompt"] == daemon.client.detokenize(ids)
    assert PROMPT in out["prompt"]
    status, out = http(daemon, "POST", "/detokenize", {"tokens": [1, -5]})
    assert status == 400 and out["error"]["param"] == "tokens[1]"


def test_metrics_on_the_http_port(daemon, model_name):
    text = urllib.request.urlopen(daemon.http_url + "/metrics", timeout=10).read().decode()
    info = [l for l in text.splitlines() if l.startswith("winnow_cache_config_info{")]
    assert len(info) == 1 and 'block_size="16"' in info[0] and info[0].endswith(" 1")
    st = daemon.client.server_status()
    layers = daemon.client.model_info().num_layers
    assert f'num_gpu_blocks="{st.kv_blocks_total // layers}"' in info[0]
    running = [l for l in text.splitlines() if l.startswith("winnow_requests_running{")]
    assert running == [f'winnow_requests_running{{model_name="{model_name}"}} 0'], running


def test_labelled_counters_exist_at_zero_from_start_up():
    with Daemon() as d:
        for code in ("INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE"):
            assert d.metric("winnow_requests_rejected_total", {"code": code}) == 0
        for reason in ("stop", "length", "cancelled", "deadline", "error"):
            assert d.metric("winnow_requests_finished_total", {"reason": reason}) == 0


def test_queue_full_is_429_and_draining_is_503():
    with Daemon("--max-seqs", "1", "--max-queue", "1", "--drain-timeout", "60") as d:
        name = json.loads(urllib.request.urlopen(d.http_url + "/v1/models").read())["data"][0]["id"]
        body = {"model": name, "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True,
                "temperature": 0, "stream": True}
        running = _open_stream(d, body)
        waiting = socket.create_connection(("127.0.0.1", d.http_port), timeout=60)
        data = json.dumps(body).encode()
        waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        b"application/json\r\n" + f"Content-Length: {len(data)}\r\n\r\n".encode()
                        + data)
        deadline = time.monotonic() + 30
        while d.client.server_status().waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status, out = http(d, "POST", "/v1/completions", {**body, "stream": False})
        assert status == 429 and out["error"]["code"] == "queue_full", out
        waiting.close()
        d.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while http(d, "GET", "/health")[0] != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, out = http(d, "POST", "/v1/completions", {**body, "stream": False})
        assert status == 503 and out["error"]["type"] == "service_unavailable", out
        running.close()
        assert d.wait_exit(60) == 0


def test_prefix_cache_usage_and_cache_salt(client, model_name):
    prompt = "Shared context for the cache test: " + "alpha beta gamma delta " * 20
    kwargs = dict(model=model_name, prompt=prompt, max_tokens=1, temperature=0)
    first = client.completions.create(**kwargs, extra_body={"cache_salt": "tenant-a"})
    again = client.completions.create(**kwargs, extra_body={"cache_salt": "tenant-a"})
    other = client.completions.create(**kwargs, extra_body={"cache_salt": "tenant-b"})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= 16  # whole blocks of the prompt
    assert other.usage.prompt_tokens_details.cached_tokens == 0   # another salt shares nothing
    assert again.choices[0].text == first.choices[0].text
