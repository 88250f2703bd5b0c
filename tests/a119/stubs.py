"""Python messages and gRPC stubs for an autosharding .proto, generated when asked for.

Nothing generated is kept in the repository: `load` runs grpcio-tools' protoc on the
.proto into a temporary directory (removed when the process exits) and imports the
result, so the peers always speak exactly the protocol file the Rust side compiles.
"""

import atexit
import importlib
import os
import shutil
import sys
import tempfile


def load(proto_path):
    """Returns the modules `(messages, services)` generated from `proto_path`.

    Raises SystemExit with protoc's complaint when the file does not compile (an old
    protoc refuses proto3 `optional`, for one).
    """
    from grpc_tools import protoc  # imported here: a missing grpcio-tools names itself

    import grpc_tools

    out = tempfile.mkdtemp(prefix="steady-a119-stubs-")
    atexit.register(shutil.rmtree, out, True)
    proto_path = os.path.abspath(proto_path)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            "-I" + os.path.dirname(proto_path),
            "-I" + well_known,
            "--python_out=" + out,
            "--grpc_python_out=" + out,
            os.path.basename(proto_path),
        ]
    )
    if status != 0:
        raise SystemExit(f"protoc failed ({status}) on {proto_path}")
    sys.path.insert(0, out)
    stem = os.path.splitext(os.path.basename(proto_path))[0]
    return importlib.import_module(stem + "_pb2"), importlib.import_module(stem + "_pb2_grpc")
