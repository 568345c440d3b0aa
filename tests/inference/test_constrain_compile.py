"""What the grammar compiler survives (node.inference.constrain, compile_threads): rule and $ref
chains deep enough to overflow a thread's stack, a bound on $refs, platforms that limit thread
stacks, and the process-wide stack size left alone."""

from __future__ import annotations

import pytest

from node.errors import InvalidRequest
from node.inference import compile_threads, constrain
from node.inference import grammar as g
from node.inference.sampling import SamplingParams

pytestmark = pytest.mark.llama


def test_a_long_chain_of_rules_or_refs_compiles_instead_of_crashing_the_node():
    """llguidance's compiler recurses once per level of a rule chain: ~3,000 levels (a 25 KB `grammar`,
    inside the 64 KiB bound) overflowed a thread's 8 MiB stack and the node died of a segfault — one
    request, or one peer's WORK frame (review r53). Run in a child process: without the fix it is the
    child that dies."""
    import subprocess
    import sys
    from pathlib import Path

    script = """
import string, sys, threading
from pathlib import Path
from node.inference import constrain, grammar as g
from node.inference.sampling import SamplingParams
from node.inference.tokenizer import ModelTokenizer
from tests.support.nodes import tiny_model
import tempfile
tok = ModelTokenizer(tiny_model(Path(tempfile.mkdtemp())))
a = string.ascii_lowercase
names = [x + y + z for x in a for y in a for z in a][:5000]
chain = "\\n".join([f"root::={names[0]}"] + [f"{names[i]}::={names[i + 1]}" for i in range(4999)] + [f'{names[-1]}::="x"'])
assert len(chain) <= g.MAX_GRAMMAR_CHARS
refs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(9000)}
refs["a9000"] = {"type": "string"}
def run():  # (an executor's thread, as the node compiles)
    constrain.check(tok, SamplingParams(grammar=g.gbnf(chain)), "grammar")
    constrain.check(tok, SamplingParams(grammar=g.json_value({"$defs": refs, "$ref": "#/$defs/a0"})))
    print("compiled", flush=True)
t = threading.Thread(target=run)
t.start()
t.join()
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, (done.returncode, done.stderr[-2000:])


def test_a_schema_with_more_refs_than_the_bound_is_a_400(tiny_tok):
    refs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(constrain.MAX_SCHEMA_REFS + 1)}
    refs[f"a{constrain.MAX_SCHEMA_REFS + 1}"] = {"type": "string"}
    with pytest.raises(InvalidRequest, match="more than 10000 \\$refs"):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"$defs": refs, "$ref": "#/$defs/a0"})))


@pytest.mark.parametrize("limit", [0x10000000, 0, -1])
def test_grammars_compile_where_the_platform_limits_thread_stacks(tiny_tok, monkeypatch, limit):
    """Windows' CPython takes thread stacks below 256 MiB only (`THREAD_MAX_STACKSIZE`, a ValueError
    past it): 512 MiB made every constrained request a 500 there (review r55). Under that rule, under one
    that refuses any size (the default stack then), and where the OS cannot map the big stack (a
    virtual-memory limit: the thread does not start, review r57), a grammar still compiles."""
    import threading

    real, real_start, current = threading.stack_size, threading.Thread.start, [0]

    def stack_size(size=0):
        if size and limit >= 0 and (limit == 0 or size >= limit):
            raise ValueError(f"size not valid: {size} bytes")
        old, current[0] = current[0], size
        real(size)
        return old

    def start(self):
        if limit == -1 and current[0] == compile_threads.COMPILE_STACK_BYTES:
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading, "stack_size", stack_size)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(compile_threads, "_compile_pool", None)  # the compile threads made again, under these rules
    constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "object", "properties": {
        "limit": {"type": "integer", "minimum": limit}}})))


def test_the_big_stack_is_set_once_not_per_compile(tiny_tok, monkeypatch):
    """threading.stack_size is process-wide: a thread per compile set it each time, and any thread another
    request started in that window got a 255 MiB stack too (review r58). The process's compile threads
    are made once; later compiles leave the process's stack size alone."""
    import threading

    compile_threads.compile_pool()  # (started at the session's start)
    real, calls = threading.stack_size, []
    monkeypatch.setattr(threading, "stack_size", lambda *a: calls.append(a) or real(*a))
    for i in range(3):
        constrain.check(tiny_tok, SamplingParams(grammar=g.json_value({"type": "integer", "minimum": 1000 + i})))
    assert calls == []
