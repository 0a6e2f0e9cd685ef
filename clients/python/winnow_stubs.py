"""Python stubs for winnow's gRPC API, generated on first use.

The stubs are not committed: protobuf's generated Python code is tied to the protobuf runtime
version that generated it, so they are produced with the installed grpcio-tools from
proto/winnow/v1/*.proto into a cache directory keyed by the protos' content and the tool
version ($WINNOW_STUBS_DIR, else ~/.cache/winnow/stubs/). Regeneration is automatic when a
proto changes.

    from winnow_stubs import load
    pb2, pb2_grpc = load()
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pathlib
import sys
import tempfile

_REPO = pathlib.Path(__file__).resolve().parents[2]
PROTO_ROOT = pathlib.Path(os.environ.get("WINNOW_PROTO_ROOT", _REPO / "proto"))


def _protos() -> list[pathlib.Path]:
    return sorted((PROTO_ROOT / "winnow" / "v1").glob("*.proto"))


def _cache_dir() -> pathlib.Path:
    import grpc_tools  # noqa: F401  (version in the key)
    from grpc_tools import protoc  # noqa: F401

    h = hashlib.sha256()
    for p in _protos():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    try:
        from importlib.metadata import version

        h.update(version("grpcio-tools").encode())
    except Exception:  # pragma: no cover - metadata missing in odd installs
        pass
    base = os.environ.get("WINNOW_STUBS_DIR")
    root = pathlib.Path(base) if base else pathlib.Path.home() / ".cache" / "winnow" / "stubs"
    return root / h.hexdigest()[:16]


def _generate(out: pathlib.Path) -> None:
    from grpc_tools import protoc

    import grpc_tools

    out.parent.mkdir(parents=True, exist_ok=True)
    # Generate into a temporary sibling, then rename: concurrent test workers never see a
    # half-written package.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={tmp}",
        f"--grpc_python_out={tmp}",
        *[str(p) for p in _protos()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTO_ROOT}")
    try:
        tmp.rename(out)
    except OSError:
        if not out.exists():
            raise


def load():
    """Returns (inference_pb2, inference_pb2_grpc), generating them if needed."""
    out = _cache_dir()
    if not (out / "winnow" / "v1" / "inference_pb2.py").exists():
        _generate(out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    pb2 = importlib.import_module("winnow.v1.inference_pb2")
    pb2_grpc = importlib.import_module("winnow.v1.inference_pb2_grpc")
    return pb2, pb2_grpc
