"""A client for the winnow daemon (winnow.v1.Inference over gRPC).

Library use:

    from winnow_client import WinnowClient
    client = WinnowClient("localhost:50051")
    for chunk in client.generate(prompt="The capital of France is", max_tokens=16):
        print(chunk.text, end="", flush=True)

Command line (installed: `winnow-client`; from a checkout: python clients/python/winnow_client.py):

    winnow-client --prompt "The capital of France is" --max-tokens 16
    winnow-client --chat "Write a haiku about caches" --policy xkv --budget 0.2
    winnow-client --info      # model info and server status

The gRPC stubs are the modules winnow.v1.inference_pb2 and inference_pb2_grpc, generated when
the package is built (re-exported here as pb2 and pb2_grpc).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Iterator, Mapping, Optional, Sequence, Union

import grpc

from winnow.v1 import inference_pb2 as pb2
from winnow.v1 import inference_pb2_grpc as pb2_grpc

__all__ = ["WinnowClient", "pb2", "pb2_grpc", "main"]

# A prompt segment: ("text", str), ("context", str), or ("embedding", modality, rows, values).
Segment = Union[tuple, "pb2.Segment"]

# grpc.health.v1 status values (HealthCheckResponse.ServingStatus).
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _encode_health_request(service: str) -> bytes:
    # HealthCheckRequest{string service = 1}: encoded by hand so that the client needs no
    # grpcio-health-checking package.
    data = service.encode()
    if not data:
        return b""
    assert len(data) < 128
    return b"\x0a" + bytes([len(data)]) + data


def _decode_health_response(data: bytes) -> int:
    # HealthCheckResponse{ServingStatus status = 1}: a single varint field (absent means 0).
    if len(data) >= 2 and data[0] == 0x08:
        return data[1]
    return 0


class _MetadataInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds fixed metadata (the API key) to every call, on plaintext and TLS channels alike
    (gRPC's call credentials refuse plaintext channels)."""

    def __init__(self, metadata: Sequence[tuple[str, str]]):
        self._metadata = list(metadata)

    def _with_metadata(self, details):
        return details._replace(metadata=list(details.metadata or []) + self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_metadata(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_metadata(details), request)


def _read(path: Optional[str]) -> Optional[bytes]:
    return pathlib.Path(path).read_bytes() if path else None


class WinnowClient:
    def __init__(self, target: str = "localhost:50051", channel: Optional[grpc.Channel] = None,
                 *, api_key: Optional[str] = None, tls: bool = False,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, options: Sequence[tuple] = ()):
        """Connects to a winnow daemon.

        api_key: sent as "authorization: Bearer <key>" on every call (--api-key-file).
        tls / tls_ca: TLS, verifying the server with the PEM CA file tls_ca (default: the
        system's roots); tls_cert + tls_key: a client certificate for mutual TLS.
        """
        if channel is None:
            opts = [("grpc.max_send_message_length", 256 << 20),
                    ("grpc.max_receive_message_length", 256 << 20), *options]
            if tls or tls_ca or tls_cert:
                creds = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca),
                                                     private_key=_read(tls_key),
                                                     certificate_chain=_read(tls_cert))
                channel = grpc.secure_channel(target, creds, options=opts)
            else:
                channel = grpc.insecure_channel(target, options=opts)
        self.channel = channel
        if api_key:
            channel = grpc.intercept_channel(
                channel, _MetadataInterceptor([("authorization", f"Bearer {api_key}")]))
        self.stub = pb2_grpc.InferenceStub(channel)
        self._calls = channel

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def build_request(
        prompt: Optional[str] = None,
        *,
        chat: Optional[Sequence[tuple[str, str]]] = None,
        token_ids: Optional[Sequence[int]] = None,
        segments: Optional[Sequence[Segment]] = None,
        add_special_tokens: Optional[bool] = None,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = 0.0,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        seed: Optional[int] = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        priority: int = 0,
        logprobs: bool = False,
        top_logprobs: int = 0,
        compression: Optional[Mapping] = None,
        cache_salt: str = "",
        request_id: str = "",
        n: int = 0,
    ):
        """A GenerateRequest from keyword arguments: exactly one of prompt, chat (a list of
        (role, content)), token_ids or segments; compression is {"policy", "budget",
        "params": {name: number}, "options": {name: string}, and optionally "scope",
        "context_tokens", "context_messages", "stage_tokens", "probe"} (docs/compression.md);
        cache_salt separates prefix caching between tenants (docs/api.md); n > 1 asks for n
        samples, their messages told apart by `index`."""
        req = pb2.GenerateRequest(request_id=request_id, priority=priority, logprobs=logprobs,
                                  top_logprobs=top_logprobs, cache_salt=cache_salt, n=n)
        if prompt is not None:
            req.prompt = prompt
        elif chat is not None:
            for role, content in chat:
                req.chat.messages.add(role=role, content=content)
        elif token_ids is not None:
            req.token_ids.ids.extend(token_ids)
        elif segments is not None:
            for seg in segments:
                req.segments.segments.append(_segment(seg))
        if add_special_tokens is not None:
            req.add_special_tokens = add_special_tokens
        # None leaves a field unset: the model's default (generation_config.json), else the
        # server's (greedy, and no top-p, top-k or min-p).
        if temperature is not None:
            req.sampling.temperature = temperature
        if top_p is not None:
            req.sampling.top_p = top_p
        if top_k is not None:
            req.sampling.top_k = top_k
        if min_p is not None:
            req.sampling.min_p = min_p
        if repetition_penalty is not None:
            req.sampling.repetition_penalty = repetition_penalty
        req.sampling.frequency_penalty = frequency_penalty
        req.sampling.presence_penalty = presence_penalty
        if compression:
            c = req.compression
            c.policy = compression.get("policy", "")
            c.budget = compression.get("budget", 0.0)
            for k, v in (compression.get("params") or {}).items():
                c.params[k] = float(v)
            for k, v in (compression.get("options") or {}).items():
                c.options[k] = str(v)
            c.scope = compression.get("scope", "")
            c.context_tokens = int(compression.get("context_tokens", 0))
            c.context_messages = int(compression.get("context_messages", 0))
            c.stage_tokens = int(compression.get("stage_tokens", 0))
            c.probe = compression.get("probe", "")
        if seed is not None:
            req.sampling.seed = seed
        if max_tokens is not None:
            req.stopping.max_tokens = max_tokens
        req.stopping.stop.extend(stop)
        req.stopping.stop_token_ids.extend(stop_token_ids)
        req.stopping.ignore_eos = ignore_eos
        return req

    def generate(self, prompt: Optional[str] = None, *, request=None,
                 timeout: Optional[float] = None, **kwargs) -> Iterator:
        """Streams GenerateResponse messages; the last one has finish_reason and usage.

        Pass either keyword arguments (see build_request) or a ready GenerateRequest. Raises
        grpc.RpcError on a non-OK status (after yielding what arrived before it).
        """
        if request is None:
            request = self.build_request(prompt, **kwargs)
        return self.stub.Generate(request, timeout=timeout)

    def generate_text(self, prompt: Optional[str] = None, **kwargs) -> tuple[str, list, object]:
        """Runs a whole generation; returns (text, token_ids, final message)."""
        text, ids, final = [], [], None
        for msg in self.generate(prompt, **kwargs):
            text.append(msg.text)
            ids.extend(msg.token_ids)
            if msg.finish_reason:
                final = msg
        return "".join(text), ids, final

    def tokenize(self, text: Optional[str] = None, add_special_tokens: bool = True, *,
                 chat: Optional[Sequence[tuple[str, str]]] = None) -> list[int]:
        """Token ids of text, or of chat messages rendered with the model's template."""
        req = pb2.TokenizeRequest(add_special_tokens=add_special_tokens)
        if chat is not None:
            for role, content in chat:
                req.chat.messages.add(role=role, content=content)
        else:
            req.text = text
        return list(self.stub.Tokenize(req).token_ids)

    def detokenize(self, ids: Sequence[int], render_special: bool = False) -> str:
        return self.stub.Detokenize(
            pb2.DetokenizeRequest(token_ids=list(ids), render_special=render_special)).text

    def model_info(self):
        return self.stub.GetModelInfo(pb2.GetModelInfoRequest())

    def server_status(self):
        return self.stub.GetServerStatus(pb2.GetServerStatusRequest())

    def health(self, service: str = "", timeout: float = 2.0) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", ..."""
        check = self._calls.unary_unary("/grpc.health.v1.Health/Check")
        raw = check(_encode_health_request(service), timeout=timeout)
        return HEALTH_STATUS.get(_decode_health_response(raw), "UNKNOWN")


def _segment(seg) -> "pb2.Segment":
    if isinstance(seg, pb2.Segment):
        return seg
    kind = seg[0]
    if kind == "text":
        return pb2.Segment(text=pb2.TextSpan(text=seg[1]))
    if kind == "context":
        return pb2.Segment(context=pb2.ContextSpan(text=seg[1]))
    if kind == "embedding":
        _, modality, rows, values = seg
        return pb2.Segment(embedding=pb2.EmbeddingSpan(modality=modality, rows=rows,
                                                       values=list(values)))
    raise ValueError(f"unknown segment kind {kind!r} (text, context or embedding)")


def _key_values(items: Sequence[str], flag: str) -> dict:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"{flag} takes name=value, got {item!r}")
        out[key] = value
    return out


def _message_dict(msg) -> dict:
    from google.protobuf import json_format

    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=os.environ.get("WINNOW_TARGET", "localhost:50051"))
    ap.add_argument("--api-key", default=os.environ.get("WINNOW_API_KEY"),
                    help="API key (the server's --api-key-file); default $WINNOW_API_KEY")
    ap.add_argument("--tls", action="store_true", help="TLS with the system's root CAs")
    ap.add_argument("--tls-ca", help="PEM CA file that signed the server's certificate")
    ap.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    ap.add_argument("--tls-key", help="its private key (PEM)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="raw prompt text")
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    src.add_argument("--token-ids", help="comma-separated prompt token ids")
    src.add_argument("--info", action="store_true", help="print model info and server status")
    ap.add_argument("--system", help="system message for --chat")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--repetition-penalty", type=float)
    ap.add_argument("--frequency-penalty", type=float, default=0.0)
    ap.add_argument("--presence-penalty", type=float, default=0.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--priority", type=int, default=0)
    ap.add_argument("--logprobs", action="store_true", help="per-token log-probabilities")
    ap.add_argument("--top-logprobs", type=int, default=0)
    ap.add_argument("--policy",
                    help="KV-compression policy, e.g. xkv, snapkv (docs/compression.md)")
    ap.add_argument("--budget", type=float, default=0.0, help="fraction of the prompt's KV kept")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=NUMBER",
                    help="numeric policy parameter (repeatable)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=STRING",
                    help="string policy parameter (repeatable)")
    ap.add_argument("--stop", action="append", default=[])
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--timeout", type=float, help="RPC deadline in seconds")
    ap.add_argument("--json", action="store_true", help="print every response as JSON")
    args = ap.parse_args(argv)

    client = WinnowClient(args.target, api_key=args.api_key, tls=args.tls, tls_ca=args.tls_ca,
                          tls_cert=args.tls_cert, tls_key=args.tls_key)
    try:
        if args.info:
            print(json.dumps({"health": client.health(),
                              "model": _message_dict(client.model_info()),
                              "status": _message_dict(client.server_status())}, indent=2))
            return 0
        compression = None
        if args.policy:
            compression = {"policy": args.policy, "budget": args.budget,
                           "params": {k: float(v) for k, v in
                                      _key_values(args.param, "--param").items()},
                           "options": _key_values(args.option, "--option")}
        kwargs = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                      top_k=args.top_k, min_p=args.min_p,
                      repetition_penalty=args.repetition_penalty,
                      frequency_penalty=args.frequency_penalty,
                      presence_penalty=args.presence_penalty, seed=args.seed, stop=args.stop,
                      ignore_eos=args.ignore_eos, priority=args.priority, logprobs=args.logprobs,
                      top_logprobs=args.top_logprobs, compression=compression)
        if args.chat is not None:
            chat = ([("system", args.system)] if args.system else []) + [("user", args.chat)]
            stream = client.generate(chat=chat, timeout=args.timeout, **kwargs)
        elif args.token_ids is not None:
            ids = [int(t) for t in args.token_ids.split(",") if t.strip()]
            stream = client.generate(token_ids=ids, timeout=args.timeout, **kwargs)
        elif args.prompt is not None:
            stream = client.generate(args.prompt, timeout=args.timeout, **kwargs)
        else:
            ap.error("one of --prompt, --chat, --token-ids or --info is required")
        for msg in stream:
            if args.json:
                print(json.dumps(_message_dict(msg)))
            else:
                sys.stdout.write(msg.text)
                sys.stdout.flush()
                if msg.finish_reason:
                    u = msg.usage
                    print(f"\n[{pb2.FinishReason.Name(msg.finish_reason)}] prompt_tokens="
                          f"{u.prompt_tokens} completion_tokens={u.completion_tokens} "
                          f"kv_blocks_peak={u.kv_blocks_peak}", file=sys.stderr)
        return 0
    except grpc.RpcError as e:
        print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
