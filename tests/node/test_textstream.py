"""Token bytes → text: never split a character, never leak a stop sequence."""

from node.inference.textstream import TextAssembler


def test_multibyte_characters_split_across_tokens():
    a = TextAssembler()
    data = "naïve 東京 🚀".encode()
    out = "".join(a.feed(data[i:i + 1]) for i in range(len(data))) + a.finish()
    assert out == "naïve 東京 🚀"


def test_incomplete_utf8_at_end_becomes_replacement():
    a = TextAssembler()
    out = a.feed(b"ok \xe6\x9d") + a.finish()
    assert out == "ok \ufffd"


def test_stop_sequence_across_tokens_is_held_back_and_cut():
    a = TextAssembler(stop=("END",))
    parts = [a.feed(p) for p in (b"hello E", b"N", b"D more")]
    assert parts == ["hello ", "", ""]
    assert a.stop_match is not None and a.stop_match.sequence == "END"
    assert a.emitted == "hello "
    assert a.finish() == ""


def test_false_stop_prefix_is_released():
    a = TextAssembler(stop=("END",))
    out = a.feed(b"the EN") + a.feed(b"gine") + a.finish()
    assert out == "the ENgine" and a.stop_match is None


def test_earliest_of_several_stop_sequences_wins():
    a = TextAssembler(stop=("\n\n", "User:"))
    out = a.feed(b"answer User: x\n\n")
    assert out == "answer " and a.stop_match.sequence == "User:"
