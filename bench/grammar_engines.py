"""llguidance vs xgrammar on our vocabularies: which grammar engine constrains the node's output.

For each vocabulary (the default model, a tiny synth vocab, and the real ones whose paths are given
on the command line) and each engine: tokenizer set-up time, grammar compile time for a few JSON
schemas, and the per-token mask time (mean, p99) while walking a valid JSON reply token by token
(the reply tokenized by llama.cpp, as the model would emit it).

    python -m bench.grammar_engines [VOCAB.gguf ...]
    python -m bench.grammar_engines /work/cache/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{llama-bpe,qwen2,llama-spm}.gguf
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from node.inference.tokenizer import ModelTokenizer

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "resources" / "models" / "swarmllm-pydoc-q8_0.gguf"

SCHEMAS = {
    "any-object": ({"type": "object"}, {"answer": "yes", "n": 3, "tags": ["a", "b"]}),
    "person": ({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                       "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"}},
        "required": ["name", "age"], "additionalProperties": False,
    }, {"name": "Ada Lovelace", "age": 36, "email": "ada@math.org"}),
    "nested": ({
        "type": "object",
        "properties": {
            "items": {"type": "array", "maxItems": 8, "items": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "kind": {"enum": ["book", "film", "song"]},
                               "score": {"type": "number"}, "notes": {"type": "string", "maxLength": 30}},
                "required": ["id", "kind"], "additionalProperties": False}},
            "total": {"type": "integer"}},
        "required": ["items", "total"], "additionalProperties": False,
    }, {"items": [{"id": 1, "kind": "book", "score": 4.5}, {"id": 2, "kind": "song", "notes": "la la"}],
        "total": 2}),
}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def pieces(tok: ModelTokenizer) -> list[bytes]:
    return [tok.piece(i) for i in range(tok.n_vocab)]


def candidates(by_bytes: dict[bytes, list[int]], longest: int, data: bytes) -> list[int]:
    """Tokens whose bytes start `data`, longest first."""
    out = []
    for n in range(min(longest, len(data)), 0, -1):
        out += by_bytes.get(data[:n], ())
    return out


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: ModelTokenizer):
        import llguidance
        import llguidance.llamacpp
        import llguidance.numpy

        self.llg = llguidance
        self.tokenizer = llguidance.llamacpp.lltokenizer_from_vocab(tok._vocab)
        self.mask = llguidance.numpy.allocate_token_bitmask(1, tok.n_vocab)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, {"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, matcher) -> None:
        self.llg.numpy.fill_next_token_bitmask(matcher, self.mask)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[0, token >> 5]) >> (token & 31)) & 1)

    def consume(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: ModelTokenizer):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(pieces(tok), xgrammar.VocabType.RAW, vocab_size=tok.n_vocab,
                                      stop_token_ids=[tok.eos_id])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.mask = xgrammar.allocate_token_bitmask(1, tok.n_vocab)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=False,
                                            separators=(",", ":"))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher) -> None:
        matcher.fill_next_token_bitmask(self.mask)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[0, token >> 5]) >> (token & 31)) & 1)

    def consume(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


def bench_vocab(label: str, path: Path, engines: list[str]) -> None:
    tok = ModelTokenizer(path)
    print(f"\n== {label}: {path.name} (n_vocab={tok.n_vocab})")
    for cls in (LLGuidance, XGrammar):
        if cls.name not in engines:
            continue
        t0 = time.perf_counter()
        engine = cls(tok)
        setup_ms = (time.perf_counter() - t0) * 1000
        print(f"  {cls.name:10s} tokenizer set-up {setup_ms:8.1f} ms")
        by_bytes: dict[bytes, list[int]] = {}
        for i, piece in enumerate(pieces(tok)):
            if piece:
                by_bytes.setdefault(piece, []).append(i)
        longest = max(map(len, by_bytes))
        for name, (schema, reply) in SCHEMAS.items():
            t0 = time.perf_counter()
            compiled = engine.compile(schema)
            compile_ms = (time.perf_counter() - t0) * 1000
            text = json.dumps(reply, separators=(",", ":"))
            data = text.encode()
            matcher = engine.matcher(compiled)
            times: list[float] = []
            ok, n_tokens = True, 0
            # walk the reply: at each step the mask, then the longest allowed token that spells
            # the text on (engines differ on which of two tokens with the same bytes they allow)
            while data:
                t0 = time.perf_counter()
                engine.fill(matcher)
                token = next((t for t in candidates(by_bytes, longest, data) if engine.allowed(t)), None)
                ok = token is not None and engine.consume(matcher, token)
                times.append((time.perf_counter() - t0) * 1e6)
                if not ok:
                    break
                data = data[len(tok.piece(token)):]
                n_tokens += 1
            mean = statistics.fmean(times)
            p99 = float(np.percentile(times, 99))
            print(f"  {cls.name:10s} {name:11s} compile {compile_ms:8.1f} ms   mask+pick+advance per token: "
                  f"mean {mean:7.1f} us  p99 {p99:7.1f} us  ({n_tokens} tokens{'' if ok else ', REJECTED'})")
    tok.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vocabs", nargs="*", type=Path, help="more GGUF vocabularies (e.g. llama.cpp's ggml-vocab-*.gguf)")
    ap.add_argument("--engines", default="llguidance,xgrammar")
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    print(f"CPU: {cpu_name()}  python {platform.python_version()}")
    from importlib.metadata import version
    print(f"llguidance {version('llguidance')}  xgrammar {version('xgrammar')}")
    from node.inference.synth import SynthSpec, write_gguf

    with tempfile.TemporaryDirectory() as tmp:
        synth = write_gguf(Path(tmp) / "synth.gguf", SynthSpec(vocab=512, name="synth-vocab"))
        bench_vocab("tiny synth vocab", synth, engines)
        if DEFAULT_MODEL.exists():
            bench_vocab("default model", DEFAULT_MODEL, engines)
        else:
            print(f"\n== default model: MISSING {DEFAULT_MODEL}")
        for path in args.vocabs:
            if not path.exists():
                print(f"\n== {path}: MISSING (skipped)")
                continue
            bench_vocab("vocabulary", path, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
