"""speck.codegen.cache: the integrity-checked on-disk store (every damaged, moved or old-format entry is a miss with
one warning, never an exception nor wrong data), the compile cache on top of it (a damaged entry is recompiled and
rewritten), its command line (info, verify, clear), and two processes filling one cold cache at the same time."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.cache import FORMAT, CacheWarning, DiskCache, cache_root
from speck.codegen.cache.cli import main as cli
from speck.codegen.cache.store import HEADER_SIZE, MAGIC, encode_entry
from speck.codegen.compiler import LLVMCompiler
from speck.uop import Context

KEY = "ab" * 32
DATA = bytes(range(256)) * 3


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"


def get_warned(store: DiskCache, key: str = KEY) -> tuple[bytes | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = store.get(key)
    return got, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_put_get_and_the_file_it_writes(private_cache: pathlib.Path) -> None:
    store = DiskCache("compile/test")
    assert store.get(KEY) is None and store.keys() == []
    assert store.put(KEY, DATA)
    path = private_cache / "compile" / "test" / KEY
    assert store.path(KEY) == path and path.read_bytes().startswith(MAGIC)
    assert len(path.read_bytes()) == HEADER_SIZE + len(KEY) + len(DATA)
    assert store.get(KEY) == DATA and store.keys() == [KEY] and store.verify() == []
    assert [p.name for p in path.parent.iterdir()] == [KEY]  # the temporary file was renamed, none is left
    assert store.put(KEY, b"other") and store.get(KEY) == b"other"  # replaced
    assert store.delete(KEY) and store.get(KEY) is None and not store.delete(KEY)


def test_cachelevel_zero_reads_and_writes_nothing(private_cache: pathlib.Path) -> None:
    store = DiskCache("beam")
    store.put(KEY, DATA)
    with Context(CACHELEVEL=0):
        assert store.get(KEY) is None and not store.put("cd" * 32, DATA)
    assert not store.path("cd" * 32).exists() and store.get(KEY) == DATA
    env = {**os.environ, "CACHELEVEL": "0"}  # the environment variable, read when speck starts
    code = "from speck.codegen.cache import DiskCache; print(DiskCache('beam').get('ab' * 32))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stderr


def test_root_follows_the_environment(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" and DiskCache("beam").directory == tmp_path / "x" / "beam"
    monkeypatch.delenv("SPECK_CACHE_DIR")
    assert cache_root() == pathlib.Path.home() / ".cache" / "speck"


@pytest.mark.parametrize("bad", ["", "../up", "a/b", ".hidden", "-x", "x" * 129, "sp ace"])
def test_keys_and_namespaces_are_plain_file_names(bad: str) -> None:
    with pytest.raises(ValueError, match="must be 1-128 characters"):
        DiskCache("beam").path(bad)
    if "/" not in bad:  # a namespace may be nested ("compile/llvm"), each part a plain name
        with pytest.raises(ValueError, match="namespace part"):
            DiskCache(f"compile/{bad}")


def corrupt(path: pathlib.Path, how: str) -> None:
    blob = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "short":
        path.write_bytes(blob[: HEADER_SIZE - 5])
    elif how == "truncated":
        path.write_bytes(blob[:-1])
    elif how == "appended":
        path.write_bytes(blob + b"\0")
    elif how == "random":
        path.write_bytes(os.urandom(len(blob)))
    elif how == "bitflip":
        path.write_bytes(blob[:-10] + bytes([blob[-10] ^ 4]) + blob[-9:])
    elif how == "other key":
        path.write_bytes(encode_entry("cd" * 32, DATA))
    else:
        raise AssertionError(how)


DAMAGE = {
    "empty": "the file is empty",
    "short": "truncated",
    "truncated": "length mismatch",
    "appended": "length mismatch",
    "random": "not a speck cache entry",
    "bitflip": "checksum mismatch",
    "other key": f"holds the entry for key '{'cd' * 32}'",
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_entry_is_a_miss_with_one_warning_naming_it(how: str) -> None:
    store = DiskCache("compile/test")
    store.put(KEY, DATA)
    corrupt(store.path(KEY), how)
    got, warned = get_warned(store)
    assert got is None and len(warned) == 1
    assert str(store.path(KEY)) in warned[0] and DAMAGE[how] in warned[0] and "rewritten" in warned[0]
    assert [str(p) for p in store.verify()] == [warned[0].removeprefix("speck cache entry ").rsplit(": ignored", 1)[0]]
    assert get_warned(store) == (None, [])  # once per process
    store.put(KEY, DATA)  # what a reader does after the miss: the entry is healthy again
    assert store.get(KEY) == DATA and store.verify() == []


@pytest.mark.parametrize("how", ["bare object", "older format", "other payload version"])
def test_old_format_entries_are_misses_with_one_warning_per_directory(how: str) -> None:
    store = DiskCache("compile/test", version=2)
    keys = [f"{i:064x}" for i in range(3)]
    for k in keys:
        if how == "bare object":
            blob = b"\x7fELF" + bytes(60)
        elif how == "older format":
            blob = bytearray(encode_entry(k, DATA, version=2))
            blob[8] = FORMAT - 1 if FORMAT > 1 else FORMAT + 1
            blob = bytes(blob)
        else:
            blob = encode_entry(k, DATA, version=1)
        store.path(k).parent.mkdir(parents=True, exist_ok=True)
        store.path(k).write_bytes(blob)
    results = [get_warned(store, k) for k in keys]
    assert all(got is None for got, _ in results)
    warned = [w for _, ws in results for w in ws]
    assert len(warned) == 1 and str(store.path(keys[0])) in warned[0] and "further old-format entries" in warned[0]
    assert all(p.old for p in store.verify()) and len(store.verify()) == 3


@given(blob=st.binary(max_size=400), cut=st.integers(0, 2000), flip=st.integers(0, 16000))
def test_no_file_content_raises_or_yields_wrong_data(blob: bytes, cut: int, flip: int) -> None:
    store = DiskCache("fuzz")
    store.put(KEY, DATA)
    path = store.path(KEY)
    good = path.read_bytes()
    mutated = bytearray(good[: cut % (len(good) + 1)])
    if mutated:
        mutated[flip // 8 % len(mutated)] ^= 1 << (flip % 8)
    for content in (blob, bytes(mutated), good[: cut % (len(good) + 1)] + blob):
        path.write_bytes(content)
        got, _ = get_warned(store)
        assert got is None or (got == DATA and content == good)


def test_an_unwritable_cache_is_not_an_error(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path / "file"))
    store = DiskCache("compile/test")
    assert not store.put(KEY, DATA) and store.get(KEY) is None and store.keys() == [] and store.clear() == 0


def test_a_failed_write_leaves_no_temporary_file(private_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DiskCache("compile/test")
    store.put(KEY, DATA)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    assert not store.put(KEY, b"new")
    assert [p.name for p in store.directory.iterdir()] == [KEY] and store.get(KEY) == DATA


# ---------------------------------------------------------------- the compile cache
ADD_IR = """
define void @add(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %ix = sext i32 %i to i64
  %pa = getelementptr float, ptr %a, i64 %ix
  %va = load float, ptr %pa
  %r = fadd float %va, 1.0
  %q = getelementptr float, ptr %o, i64 %ix
  store float %r, ptr %q
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


class Counting(LLVMCompiler):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def compile_uncached(self, src: str) -> bytes:
        self.calls += 1
        return super().compile_uncached(src)


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_a_damaged_compile_entry_is_recompiled_and_rewritten(how: str) -> None:
    c = Counting()
    obj = c.compile(ADD_IR)
    path = c.disk_cache().path(c.cache_key(ADD_IR))
    corrupt(path, how)
    with pytest.warns(CacheWarning, match=str(path)):
        assert c.compile(ADD_IR) == obj
    assert c.calls == 2 and c.disk_cache().verify() == []
    assert c.compile(ADD_IR) == obj and c.calls == 2  # a hit again


def test_invalidate_and_recompile_bypass_the_entry() -> None:
    c = Counting()
    obj = c.compile(ADD_IR)
    store, key = c.disk_cache(), c.cache_key(ADD_IR)
    store.put(key, b"an object that does not load")  # intact header, wrong object: only a loader can tell
    assert c.compile(ADD_IR) == b"an object that does not load" and c.calls == 1
    assert c.recompile(ADD_IR) == obj and c.calls == 2 and store.get(key) == obj
    assert c.invalidate(ADD_IR) and not store.path(key).exists() and not c.invalidate(ADD_IR)
    assert c.compile(ADD_IR) == obj and c.calls == 3


# ---------------------------------------------------------------- the command line
def fill(root: pathlib.Path) -> None:
    DiskCache("compile/llvm").put(KEY, DATA)
    DiskCache("compile/llvm").put("cd" * 32, DATA[:100])
    DiskCache("beam").put("ef" * 32, b"[]")


def test_info_lists_namespaces_entries_and_sizes(private_cache: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    assert cli(["info"]) == 0
    assert "no entries" in capsys.readouterr().out
    fill(private_cache)
    assert cli(["info"]) == 0
    out = capsys.readouterr().out
    assert str(private_cache) in out and "$SPECK_CACHE_DIR" in out and "caching on" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    size = 2 * HEADER_SIZE + 2 * len(KEY) + len(DATA) + 100
    assert rows["compile/llvm"][1:] == ["2", f"{size / 1024:.1f}", "KiB", "0", "0", "0"]
    assert rows["beam"][1] == "1" and rows["total"][1] == "3"
    legacy = private_cache / "compile" / "llvm" / ("12" * 32)
    legacy.write_bytes(b"\x7fELF" + bytes(100))
    corrupt(DiskCache("beam").path("ef" * 32), "truncated")
    (private_cache / "beam" / ".tmp-x").write_bytes(b"")
    assert cli(["info"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["compile/llvm"][1] == "2" and rows["compile/llvm"][-3:] == ["1", "0", "0"]  # one old format
    assert rows["beam"][1] == "0" and rows["beam"][-3:] == ["0", "1", "1"]  # one damaged, one temporary
    assert rows["total"][1] == "2" and rows["total"][-3:] == ["1", "1", "1"]


def test_verify_reports_damage_and_deletes_it(private_cache: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    fill(private_cache)
    assert cli(["verify"]) == 0 and "verified 3 entries: all intact" in capsys.readouterr().out
    bad = DiskCache("compile/llvm").path(KEY)
    corrupt(bad, "bitflip")
    (bad.parent / ".tmp-abandoned").write_bytes(b"half an entry")
    assert cli(["verify"]) == 1
    out = capsys.readouterr().out
    assert f"damaged: {bad}: checksum mismatch" in out and "0 in an old format, 2 damaged or left over" in out
    assert f"temporary: {bad.parent / '.tmp-abandoned'}: temporary file" in out
    assert cli(["verify", "beam"]) == 0  # restricted to a namespace
    capsys.readouterr()
    assert cli(["verify", "--delete"]) == 0 and not bad.exists()
    assert cli(["verify"]) == 0 and "verified 2 entries: all intact" in capsys.readouterr().out
    legacy = bad.parent / ("12" * 32)
    legacy.write_bytes(b"\x7fELF" + bytes(100))  # an old-format entry is listed, but is no damage
    assert cli(["verify"]) == 0 and f"old format: {legacy}: a bare entry" in capsys.readouterr().out


def test_clear_removes_speck_files_only(private_cache: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    fill(private_cache)
    foreign = private_cache / "notes" / "todo.txt"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("not speck's")
    assert cli(["clear", "beam"]) == 0 and "removed 1 files" in capsys.readouterr().out
    assert not (private_cache / "beam").exists() and DiskCache("compile/llvm").keys() == ["ab" * 32, "cd" * 32]
    legacy = private_cache / "compile" / "clang" / ("12" * 32)
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"\x7fELF" + bytes(100))  # a bare object of the old compile cache is speck's too
    assert cli(["clear"]) == 0 and "removed 3 files" in capsys.readouterr().out
    assert foreign.read_text() == "not speck's" and sorted(p.name for p in private_cache.iterdir()) == ["notes"]


def test_the_module_runs_as_a_program(private_cache: pathlib.Path) -> None:
    fill(private_cache)
    proc = subprocess.run([sys.executable, "-W", "error", "-m", "speck.codegen.cache", "info"], capture_output=True,
                          text=True, env=os.environ.copy())  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "compile/llvm" in proc.stdout and proc.stderr == ""
    proc = subprocess.run([sys.executable, "-m", "speck.codegen.cache"], capture_output=True, text=True)
    assert proc.returncode == 2 and "info,verify,clear" in proc.stderr


# ---------------------------------------------------------------- two processes, one cold cache
WORKER = textwrap.dedent("""
    import hashlib, sys
    from speck.codegen import to_program
    from speck.codegen.compiler import LLVMCompiler
    from speck.codegen.kernel_info import KernelInfo
    from speck.codegen.renderer.llvmir import LLVMRenderer
    from speck.uop import AxisType, UOp, dtypes

    class Counting(LLVMCompiler):
        calls = 0
        def compile_uncached(self, src):
            Counting.calls += 1
            return super().compile_uncached(src)

    def kernel(i):
        r = UOp.range(64 + i, 0, AxisType.GLOBAL)
        o, a = UOp.param(0, dtypes.float32.ptr(64 + i)), UOp.param(1, dtypes.float32.ptr(64 + i))
        val = a.index(r).load() * UOp.const(dtypes.float32, 1.5 + i) + UOp.const(dtypes.float32, float(i))
        return UOp.sink(o.index(r).store(val).end(r), arg=KernelInfo(name=f"k{i}"))

    renderer, compiler = LLVMRenderer(), Counting()
    srcs = [to_program(kernel(i), renderer).src for i in range(int(sys.argv[1]))]
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts every worker at once
    for src in srcs:
        print(hashlib.sha256(compiler.compile(src)).hexdigest())
    print("compiled", Counting.calls)
""")


def test_two_processes_fill_one_cold_cache_at_once(private_cache: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    n = 8
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "CacheWarning" not in err, err  # neither saw a half-written entry of the other
    digests = [out.splitlines()[:n] for out, _ in outs]
    assert digests[0] == digests[1] and len(set(digests[0])) == n
    # a third process finds every object in the cache, the same bytes, and compiles nothing
    third = subprocess.run([sys.executable, "-c", WORKER, str(n)], input="go\n", capture_output=True, text=True)
    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines()[1 : n + 1] == digests[0] and third.stdout.splitlines()[-1] == "compiled 0"
    # the lowered-kernel cache (used when SPEC is off) holds an entry per kernel beside the compiled objects
    entries = sum(len(DiskCache(f"{kind}/llvm").keys()) for kind in ("compile", "lowered"))
    assert entries in (n, 2 * n)
    assert cli(["verify"]) == 0 and f"verified {entries} entries: all intact" in capsys.readouterr().out
    assert sorted(p.name for p in (private_cache / "compile" / "llvm").iterdir()) == DiskCache("compile/llvm").keys()


RACER = textwrap.dedent("""
    import sys, warnings
    from speck.codegen.cache import CacheWarning, DiskCache
    warnings.simplefilter("error", CacheWarning)  # a torn entry would be a damaged one: fail loudly
    mine = bytes([int(sys.argv[1])]) * 200_000
    store, key, seen = DiskCache("race"), "ab" * 32, set()
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(300):
        store.put(key, mine)
        got = store.get(key)
        assert got is not None and len(got) == len(mine) and len(set(got)) == 1, "a torn read"
        seen.add(got[0])
    print(sorted(seen))
""")


def test_concurrent_writers_and_readers_never_see_a_torn_entry(private_cache: pathlib.Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (1, 2)]  # fmt: skip
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err
    assert DiskCache("race").verify() == [] and len(DiskCache("race").keys()) == 1
    assert not [p for p in (private_cache / "race").iterdir() if p.name.startswith(".tmp-")]
