"""The engine's native float32 kernels (``kernels.c``), compiled on first use and loaded through ctypes.

A plain C file with no torch headers compiles in about a second (a ``torch.utils.cpp_extension`` build takes
~40 s). The library is cached per source, compiler flags and CPU (``-march=native``: a cache shared by
machines with different CPUs must not hand one machine another's instructions) under
``$ASYNCRL_CACHE_DIR`` or ``~/.cache/asyncrl``; concurrent processes write it to a temporary name and rename
it into place. Without a C compiler, or with ``ASYNCRL_NATIVE=0``, ``load()`` returns None and the engine
keeps its torch path (the same results up to float32 rounding, slower).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels.c")
PANEL = 16  # output columns per panel of a packed weight (kernels.c)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]
log = logging.getLogger(__name__)
_lock = threading.Lock()
_loaded: dict[Path, "Kernels | None"] = {}  # per cache directory


class Kernels:
    """Typed entry points of the compiled library, each checking what it is given (``_check``)."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        c_int, c_ptr, c_float = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._attn = lib.decode_attention
        self._attn.argtypes = [c_ptr] * 6 + [c_int] * 7 + [c_float, c_int]
        self._attn.restype = None
        self._silu = lib.silu_mul
        self._silu.argtypes = [c_ptr, c_ptr, c_int, c_int, c_int]
        self._silu.restype = None
        self._rms = lib.rms_norm
        self._rms.argtypes = [c_ptr, c_ptr, c_ptr, c_int, c_int, c_float, c_int]
        self._rms.restype = None
        self._sample = lib.sample
        self._sample.argtypes = [c_ptr, c_int, c_int] + [c_ptr] * 6 + [c_int]
        self._sample.restype = None
        self._gemm = lib.gemm
        self._gemm.argtypes = [c_ptr, c_int, c_int, c_ptr, c_int, c_ptr, c_int, c_ptr, c_int]
        self._gemm.restype = None

    def decode_attention(
        self,
        qkv: torch.Tensor,
        pos: torch.Tensor,
        rot: torch.Tensor,
        cache: torch.Tensor,
        out: torch.Tensor,
        scratch: torch.Tensor,
        first_slot: int,
        nq: int,
        nk: int,
        q_scale: float,
    ) -> None:
        """Rotate q and k of ``qkv`` (S, nq + 2 nk, D) in place by ``rot`` (positions, D/2, 2), write k and v at
        ``pos`` (S,) into ``cache`` (2, slots, nk, cache_len, D), and write the attention of each query head
        over positions 0..pos into ``out`` (S, nq D). ``scratch`` holds S nk nq/nk cache_len floats."""
        S, heads, D = qkv.shape
        cache_len = cache.shape[3]
        _check(
            heads == nq + 2 * nk
            and nq % nk == 0
            and D % 8 == 0
            and tuple(cache.shape[2:]) == (nk, cache_len, D)
            and first_slot + S <= cache.shape[1]
            and out.shape == (S, nq * D)
            and pos.shape == (S,)
            and scratch.numel() >= S * nq * cache_len
            and rot.numel() >= cache_len * D,
            "decode_attention",
            qkv=qkv,
            pos=pos,
            rot=rot,
            cache=cache,
            out=out,
            scratch=scratch,
        )
        if int(pos.max()) >= cache_len - 1:
            raise ValueError(f"decode_attention: position {int(pos.max())} is outside the cache of {cache_len - 1}")
        self._attn(
            qkv.data_ptr(),
            pos.data_ptr(),
            rot.data_ptr(),
            cache.data_ptr(),
            out.data_ptr(),
            scratch.data_ptr(),
            S,
            first_slot,
            cache.shape[1],
            nq,
            nk,
            D,
            cache_len,
            q_scale,
            torch.get_num_threads(),
        )

    def silu_mul(self, gu: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` (M, I) = silu(gu[:, :I]) * gu[:, I:] for ``gu`` (M, 2 I)."""
        M, I = out.shape
        _check(gu.shape == (M, 2 * I), "silu_mul", gu=gu, out=out)
        self._silu(gu.data_ptr(), out.data_ptr(), M, I, torch.get_num_threads())

    def gemm(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        out: torch.Tensor,
        bias: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        """``out`` (M, N) = ``x`` (M, K) @ W (+ ``bias``), or ``out += x @ W`` with ``accumulate``, for W packed
        in panels of 16 output columns, ``w`` (ceil(N / 16), K, 16) (decoder.py). Returns ``out``."""
        (M, K), N = x.shape, out.shape[1]
        _check(
            w.shape[0] * PANEL >= N
            and tuple(w.shape[1:]) == (K, PANEL)
            and out.shape[0] == M
            and (bias is None or bias.shape == (N,)),
            "gemm",
            x=x,
            packed_weight=w,
            out=out,
            **({} if bias is None else {"bias": bias}),
        )
        self._gemm(
            x.data_ptr(),
            M,
            K,
            w.data_ptr(),
            N,
            None if bias is None else bias.data_ptr(),
            int(accumulate),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
        """RMSNorm of the rows of ``x`` (M, N) scaled by ``weight`` (N,), into ``out``; returns ``out``."""
        M, N = x.shape
        _check(N % 8 == 0 and weight.shape == (N,) and out.shape == x.shape, "rms_norm", x=x, weight=weight, out=out)
        self._rms(x.data_ptr(), weight.data_ptr(), out.data_ptr(), M, N, eps, torch.get_num_threads())
        return out

    def sample(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor,
        greedy: torch.Tensor,
        u: torch.Tensor,
        scratch: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of ``logits`` (S, V) and its log-probability (sampling.py's ``sample_rows`` without
        top-k/top-p): greedy rows (``greedy`` (S,) bool) take the argmax, the others draw from
        softmax(logits / temperature) by the inverse CDF at ``u`` (S,). ``scratch`` holds at least (S, V)."""
        S, V = logits.shape
        _check(
            temperature.shape == u.shape == greedy.shape == (S,) and scratch.numel() >= S * V,
            "sample",
            logits=logits,
            temperature=temperature,
            greedy=greedy,
            u=u,
            scratch=scratch,
        )
        tokens, logprobs = torch.empty(S, dtype=torch.int64), torch.empty(S, dtype=torch.float32)
        self._sample(
            logits.data_ptr(),
            S,
            V,
            temperature.data_ptr(),
            greedy.data_ptr(),
            u.data_ptr(),
            tokens.data_ptr(),
            logprobs.data_ptr(),
            scratch.data_ptr(),
            torch.get_num_threads(),
        )
        return tokens, logprobs


def _check(ok: bool, kernel: str, **tensors: torch.Tensor) -> None:
    """Refuse arguments that would make ``kernel`` read or write outside its tensors: the shapes it was given
    must hold, and every tensor must be a contiguous CPU float32 tensor (positions int64, flags bool)."""
    dtypes = {"pos": torch.int64, "greedy": torch.bool}
    ok = ok and all(
        t.is_contiguous() and t.device.type == "cpu" and t.dtype == dtypes.get(name, torch.float32)
        for name, t in tensors.items()
    )
    if not ok:
        shapes = ", ".join(
            f"{name} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            f"{'' if t.is_contiguous() else ' (not contiguous)'}"
            for name, t in tensors.items()
        )
        raise ValueError(f"{kernel}: arguments do not fit: {shapes}")


def cache_dir() -> Path:
    base = os.environ.get("ASYNCRL_CACHE_DIR")
    if not base:
        try:
            base = Path.home() / ".cache" / "asyncrl"
        except RuntimeError:  # no HOME and no passwd entry (a container run as an arbitrary uid)
            base = Path(tempfile.gettempdir()) / f"asyncrl-{os.getuid()}"
    return Path(base) / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(cc: str, out_dir: Path) -> Path:
    """Compile ``kernels.c`` into ``out_dir`` (if not already there) and return the library's path. Raises
    RuntimeError with the compiler's message if it fails."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_flags()]).encode())
    path = out_dir / f"asyncrl_kernels_{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        res = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE}: {res.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o755)  # mkstemp made it private; a shared cache must be readable by others
        os.replace(tmp, path)  # atomic: a concurrent process sees no library or a whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load() -> Kernels | None:
    """The compiled kernels, or None (logged once) where they cannot be built or ``ASYNCRL_NATIVE=0``."""
    if os.environ.get("ASYNCRL_NATIVE", "1") == "0":
        return None
    with _lock:
        out_dir = cache_dir()
        if out_dir not in _loaded:
            _loaded[out_dir] = _load(out_dir)
        return _loaded[out_dir]


def _load(out_dir: Path) -> Kernels | None:
    cc = compiler()
    if cc is None:
        log.warning(
            "no C compiler (cc, gcc or clang) found: the engine decodes through torch alone, slower; "
            "install one (e.g. apt-get install gcc) for its native kernels"
        )
        return None
    try:
        path = build(cc, out_dir)
        return Kernels(ctypes.CDLL(str(path)), path)
    except (OSError, RuntimeError) as e:
        log.warning(
            "the engine's native kernels could not be built or loaded (%s); decoding through torch alone, slower", e
        )
        return None
