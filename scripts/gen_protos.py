"""Generate `gen/` from `proto/` with grpcio-tools and mypy-protobuf.

One script so that CI and developers produce byte-identical output; `--check` regenerates into a
scratch folder and fails when the committed `gen/` differs, so hand edits and stale code are caught.

Besides the Python modules it writes `amc/v1/descriptor_set.binpb`: every contract file with its
imports *and its source comments* (protoc `--include_source_info`, the same FileDescriptorSet a
`buf build` image holds). Generated `_pb2` modules drop comments; the cloud serves this set through
reflection so `grpcurl describe` shows the documentation.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
GEN_ROOT = ROOT / "gen"
HEADER = '"""Generated from proto/ by scripts/gen_protos.py. Do not edit."""\n'
DESCRIPTOR_SET = Path("amc/v1/descriptor_set.binpb")


def generate(out: Path) -> None:
    """Run protoc for every .proto file into `out` and add the package markers."""
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    (out / DESCRIPTOR_SET).parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        f"--descriptor_set_out={out / DESCRIPTOR_SET}",
        "--include_source_info",
        "--include_imports",
        *protos,
    ]
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT)
    for package_dir in {(out / p).parent for p in protos}:
        while package_dir != out:
            (package_dir / "__init__.py").write_text(HEADER)
            (package_dir / "py.typed").write_text("")
            package_dir = package_dir.parent


def differences(left: Path, right: Path) -> list[str]:
    """Files that differ, or exist on one side only, between two trees (caches ignored)."""
    cmp = filecmp.dircmp(left, right, ignore=["__pycache__"])
    found = [str(Path(left, n)) for n in cmp.left_only + cmp.right_only + cmp.diff_files]
    for name in cmp.common_dirs:
        found += differences(left / name, right / name)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if gen/ is not fresh")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as scratch:
            generate(Path(scratch))
            stale = differences(GEN_ROOT, Path(scratch))
        if stale:
            print("gen/ is stale; run scripts/gen_protos.py:\n  " + "\n  ".join(stale))
            return 1
        print("gen/ is fresh")
        return 0
    shutil.rmtree(GEN_ROOT, ignore_errors=True)
    generate(GEN_ROOT)
    print(f"generated {GEN_ROOT.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
