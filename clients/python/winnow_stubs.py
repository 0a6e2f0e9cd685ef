"""The Python stubs of winnow's gRPC API (package winnow.v1), generated from proto/.

Two users:
- the package build (setup.py): `run_protoc(build_lib)` puts winnow/v1/inference_pb2*.py into
  the wheel, so an installed winnow-client imports them like any module (no protoc at import);
- a source checkout without installing (tests, bench, `python clients/python/winnow_client.py`):
  `use_source_tree()` generates them once into a cache directory keyed by the protos' content
  and the grpcio-tools version ($WINNOW_STUBS_DIR, else ~/.cache/winnow/stubs/) and puts that
  and clients/python/src on sys.path. A changed proto regenerates them.

The stubs are never committed: protobuf's generated code is tied to the protobuf runtime of the
protoc that generated it ("NO CHECKED-IN PROTOBUF GENCODE").
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# clients/python/proto is a link to the repository's proto/ (and a copy inside an sdist).
PROTO_ROOT = pathlib.Path(os.environ.get("WINNOW_PROTO_ROOT", HERE / "proto"))


def _protos() -> list[pathlib.Path]:
    return sorted((PROTO_ROOT / "winnow" / "v1").glob("*.proto"))


def run_protoc(out: pathlib.Path) -> None:
    """Generates winnow/v1/*_pb2.py, *_pb2_grpc.py and *.pyi (with __init__.py) under `out`."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={out}",
            f"--grpc_python_out={out}", f"--pyi_out={out}", *[str(p) for p in _protos()]]
    if not _protos() or protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTO_ROOT}")
    for package in (out / "winnow", out / "winnow" / "v1"):
        (package / "__init__.py").touch()


def _cache_dir() -> pathlib.Path:
    from importlib.metadata import version

    h = hashlib.sha256()
    for p in _protos():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    h.update(version("grpcio-tools").encode())
    base = os.environ.get("WINNOW_STUBS_DIR")
    root = pathlib.Path(base) if base else pathlib.Path.home() / ".cache" / "winnow" / "stubs"
    return root / h.hexdigest()[:16]


def use_source_tree() -> None:
    """Makes `import winnow_client` and `import winnow.v1` work from this checkout."""
    out = _cache_dir()
    if not (out / "winnow" / "v1" / "inference_pb2.py").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        # Generate into a temporary sibling, then rename: concurrent test workers never see a
        # half-written package.
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
        run_protoc(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not out.exists():
                raise
    # To the front even when already on the path: a caller may since have put this script's
    # directory (which holds the winnow_client.py launcher) ahead of the package.
    for path in (str(out), str(HERE / "src")):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
