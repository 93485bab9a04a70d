"""Weight evidence from saved checkpoints: per-tensor digests, compared across the initial weights and each step.

A tensor's digest is sha256 over its raw bytes (C order, as stored); a snapshot's digest is sha256 over
`name dtype shape tensor-sha256` lines in sorted-name order, so file layout, shard split, step numbers and
timestamps do not matter. Safetensors files are read through their header (8-byte length + JSON, the format's
spec) and hashed in chunks; torch files are opened with `torch.load(mmap=True, weights_only=True)`.
torch is imported only inside the functions that need it: the suite stays stdlib-only at import time.
Memory stays bounded: one tensor at a time, read in CHUNK pieces.
"""
import ctypes
import fnmatch
import hashlib
import json
import os
import struct
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # only for annotations: torch is imported where it is used
    import torch

CHUNK = 1 << 24
SAFETENSORS = (".safetensors",)
TORCH = (".bin", ".pt", ".pth")
FIRST = 5                                   # differing tensors listed in the evidence
TORCH_TO_ST = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
               "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
               "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
ST_TO_TORCH = {v: k for k, v in TORCH_TO_ST.items()}


class Unreadable(Exception):
    """A checkpoint that is missing, empty or cannot be parsed."""


def weight_files(directory: str) -> list[str]:
    """The weight files of an HF-style directory: *.safetensors, else torch files (*.bin, *.pt, *.pth)."""
    if not os.path.isdir(directory):
        raise Unreadable(f"{directory}: no such directory")
    names = sorted(os.listdir(directory))
    for suffixes in (SAFETENSORS, TORCH):
        found = [os.path.join(directory, n) for n in names if n.endswith(suffixes)
                 and os.path.isfile(os.path.join(directory, n)) and not n.startswith(("optim", "extra"))]
        if found:
            return found
    raise Unreadable(f"{directory}: no *.safetensors or torch (*.bin, *.pt, *.pth) weight file")


def _safetensors_header(path: str) -> tuple[int, dict[str, Any]]:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise Unreadable(f"{path}: shorter than a safetensors header")
        size = struct.unpack("<Q", head)[0]
        if size > os.path.getsize(path) - 8:
            raise Unreadable(f"{path}: header length {size} runs past the end of the file")
        try:
            header = json.loads(fh.read(size))
        except ValueError as err:
            raise Unreadable(f"{path}: safetensors header is not JSON: {err}") from None
    header.pop("__metadata__", None)
    return 8 + size, header


def _hash_range(fh: BinaryIO, start: int, length: int) -> str:
    digest = hashlib.sha256()
    fh.seek(start)
    left = length
    while left:
        chunk = fh.read(min(CHUNK, left))
        if not chunk:
            raise Unreadable(f"{fh.name}: ends inside a tensor")
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def _safetensors_entries(path: str) -> dict[str, dict[str, Any]]:
    base, header = _safetensors_header(path)
    out = {}
    try:
        order = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])  # one sequential pass
        with open(path, "rb") as fh:
            for name, info in order:
                begin, end = info["data_offsets"]
                out[name] = {"dtype": info["dtype"], "shape": list(info["shape"]),
                             "sha256": _hash_range(fh, base + begin, end - begin), "file": path}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise Unreadable(f"{path}: malformed safetensors header entry: {err!r}") from None
    return out


def _state_dict(path: str) -> dict[str, "torch.Tensor"]:
    import torch

    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any load error is an unreadable checkpoint
        raise Unreadable(f"{path}: torch.load failed: {err.__class__.__name__}: {err}") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise Unreadable(f"{path}: expected a dict of tensors (a state_dict)")
    return obj


def _tensor_sha256(tensor: "torch.Tensor") -> str:
    """sha256 of a CPU tensor's raw bytes (C order), fed in CHUNK pieces."""
    digest = hashlib.sha256()
    tensor = tensor.detach().contiguous()
    size, ptr = tensor.numel() * tensor.element_size(), tensor.data_ptr()
    for offset in range(0, size, CHUNK):
        digest.update(ctypes.string_at(ptr + offset, min(CHUNK, size - offset)))
    return digest.hexdigest()


def _dtype_name(tensor: "torch.Tensor") -> str:
    name = str(tensor.dtype).replace("torch.", "")
    return TORCH_TO_ST.get(name, name)


def _torch_entries(path: str) -> dict[str, dict[str, Any]]:
    state = _state_dict(path)
    out = {}
    for name in sorted(state):
        tensor = state[name]
        out[name] = {"dtype": _dtype_name(tensor), "shape": list(tensor.shape),
                     "sha256": _tensor_sha256(tensor), "file": path}
    return out


def snapshot(directory: str) -> dict[str, Any]:
    """{"path", "files", "tensors": {name: {dtype, shape, sha256, file}}, "digest", "bytes"} of one directory."""
    files = weight_files(directory)
    tensors: dict[str, dict[str, Any]] = {}
    for path in files:
        entries = _safetensors_entries(path) if path.endswith(SAFETENSORS) else _torch_entries(path)
        twice = sorted(set(entries) & set(tensors))
        if twice:
            raise Unreadable(f"{directory}: tensor {twice[0]!r} appears in more than one file")
        tensors.update(entries)
    if not tensors:
        raise Unreadable(f"{directory}: no tensors")
    combined = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        combined.update(f"{name} {t['dtype']} {t['shape']} {t['sha256']}\n".encode())
    return {"path": directory, "files": [os.path.basename(f) for f in files], "tensors": tensors,
            "digest": combined.hexdigest()}


def load_tensor(entry: dict[str, Any], name: str) -> "torch.Tensor":
    """One tensor as a torch tensor (for the max abs difference of a differing tensor)."""
    import torch

    path = entry["file"]
    if path.endswith(SAFETENSORS):
        base, header = _safetensors_header(path)
        info = header[name]
        begin, end = info["data_offsets"]
        with open(path, "rb") as fh:
            fh.seek(base + begin)
            data = bytearray(fh.read(end - begin))
        dtype = getattr(torch, ST_TO_TORCH.get(info["dtype"], "uint8"))
        return torch.frombuffer(data, dtype=dtype).reshape(info["shape"]) if data else torch.empty(info["shape"])
    return _state_dict(path)[name].clone()


def max_abs_diff(a: dict[str, Any], b: dict[str, Any], name: str) -> float | str:
    """Largest |a - b| over the elements of tensor `name` (a float; 'nan' stays nan), or a string reason."""
    ta, tb = a["tensors"][name], b["tensors"][name]
    if (ta["dtype"], ta["shape"]) != (tb["dtype"], tb["shape"]):
        return f"{ta['dtype']}{ta['shape']} vs {tb['dtype']}{tb['shape']}"
    x, y = load_tensor(ta, name), load_tensor(tb, name)
    if x.numel() == 0:
        return 0.0
    if x.dtype.is_floating_point:
        return (x.double() - y.double()).abs().max().item()
    return (x.long() - y.long()).abs().max().item()


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What differs between two snapshots: names only in one, and changed / unchanged tensors (sorted)."""
    names_a, names_b = set(a["tensors"]), set(b["tensors"])
    both = sorted(names_a & names_b)
    fields = ("sha256", "dtype", "shape")
    changed = [n for n in both if any(a["tensors"][n][f] != b["tensors"][n][f] for f in fields)]
    return {"only_before": sorted(names_a - names_b), "only_after": sorted(names_b - names_a),
            "changed": changed, "unchanged": [n for n in both if n not in set(changed)]}


def summary(snap: dict[str, Any]) -> dict[str, Any]:
    """Evidence form of a snapshot: digest, tensor count, files (not every tensor's hash)."""
    return {"path": snap["path"], "digest": snap["digest"], "tensors": len(snap["tensors"]), "files": snap["files"]}


def allowed_to_stay(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
