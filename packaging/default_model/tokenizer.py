"""Byte-fallback SentencePiece BPE tokenizer with ChatML special tokens.

BPE (not unigram) because llama.cpp's ``llama`` (SPM) tokenizer merges pieces greedily by score,
which is exactly SentencePiece BPE encoding; a unigram model would tokenize differently there.
No dummy space prefix and identity normalisation, so decode(encode(text)) == text for any text.
"""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIALS = (IM_START, IM_END)


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """ChatML, exactly as the GGUF's chat template renders it."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def train(texts: list[str], vocab_size: int, model_prefix: Path) -> Path:
    """Train the SentencePiece model on ``texts`` (one sample per entry); return the .model path."""
    # SentencePiece reads one sentence per line; newlines inside a sample become byte tokens.
    lines = [line for text in texts for line in text.split("\n") if line]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(model_prefix),
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        max_sentence_length=1 << 16,
        unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        unk_piece=UNK, bos_piece=BOS, eos_piece=EOS, pad_piece=PAD,
        user_defined_symbols=list(SPECIALS),
        num_threads=1,  # one thread keeps merge order deterministic
        minloglevel=2,
    )
    return model_prefix.with_suffix(".model")


class Tokenizer:
    """Thin wrapper: encode samples (chat or plain) to ids the way llama.cpp will see them."""

    def __init__(self, model_path: Path):
        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        self.unk_id, self.pad_id = self.sp.unk_id(), self.sp.pad_id()
        self.im_start_id = self.sp.piece_to_id(IM_START)
        self.im_end_id = self.sp.piece_to_id(IM_END)

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Plain encoding; user-defined ChatML markers in ``text`` become their single ids."""
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)

    def encode_sample(self, sample: list[dict] | str) -> list[int]:
        """BOS + chat (ends with <|im_end|>\\n) or BOS + plain text + </s>."""
        if isinstance(sample, str):
            return [self.bos_id, *self.encode(sample), self.eos_id]
        return [self.bos_id, *self.encode(render_chat(sample))]
