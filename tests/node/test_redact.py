"""Redaction: every address or host becomes a kind-naming, per-report salted tag."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.redact import Redactor

KEY = "sk-swarm-0123456789abcdef0123456789abcdef01234567"


def test_ipv4_public_private_loopback():
    r = Redactor(salt=b"s" * 16)
    text = r.text("peer 8.8.8.8:8810 and 192.168.1.20:8810, 10.0.0.7, self 127.0.0.1:8800, any 0.0.0.0:8810")
    assert "8.8.8.8" not in text and "192.168.1.20" not in text and "10.0.0.7" not in text
    assert re.search(r"<public-ip-[0-9a-f]{4}>:8810", text)
    assert re.search(r"<private-ip-[0-9a-f]{4}>:8810", text)
    assert "127.0.0.1:8800" in text and "0.0.0.0:8810" in text


def test_ipv6_forms():
    r = Redactor()
    text = r.text("a [2001:4860:4860::8888]:8810 b fe80::1%eth0 c fd00::5 d [::1]:8800 e ::ffff:192.168.0.9")
    assert "2001:4860" not in text and "fe80::1" not in text and "fd00::5" not in text and "192.168.0.9" not in text
    assert re.search(r"\[<public-ip-[0-9a-f]{4}>\]:8810", text)
    assert text.count("<private-ip-") == 3
    assert "[::1]:8800" in text


def test_same_host_same_tag_within_report_and_salted_across():
    r1, r2 = Redactor(), Redactor()
    one = r1.text("x 203.0.113.9:1 y 203.0.113.9:2 z 198.51.100.1")
    tags = re.findall(r"<(?:public|private)-ip-([0-9a-f]{4})>", one)
    assert tags[0] == tags[1] and tags[0] != tags[2]
    two = r2.text("x 203.0.113.9:1")
    # a different report uses a different salt (tags collide only by 1/65536 chance)
    assert r1._salt != r2._salt
    assert ":1" in two


def test_host_names_and_known_single_label_hosts():
    r = Redactor(known_hosts=["mylaptop"])
    text = r.text("dial relay.example.com:8810; mdns mylaptop.local:8810; host mylaptop; localhost:8800 ok")
    assert "example.com" not in text and "mylaptop" not in text
    assert re.search(r"<host-[0-9a-f]{4}>:8810", text)
    assert "localhost:8800" in text


def test_names_that_are_not_hosts_survive():
    r = Redactor()
    text = r.text("model=swarmllm-pydoc-q8_0-1a2b3c4d file node.log version 0.1.0 module node.api.server "
                  "x-swarm-route tok_per_sec=33.8")
    assert "swarmllm-pydoc-q8_0-1a2b3c4d" in text
    assert "node.log" in text and "0.1.0" in text and "node.api.server" in text and "33.8" in text


def test_paths_and_api_key_never_appear():
    r = Redactor(secrets_to_hide=[KEY])
    text = r.text(f"key {KEY} at /home/alice/.local/share/swarmllm/api_key and C:\\Users\\alice\\models\\m.gguf; route /v1/chat/completions")
    assert KEY not in text and "alice" not in text
    assert "<api-key>" in text and "<path>" in text
    assert "/v1/chat/completions" in text


def test_paths_with_spaces_forward_slash_windows_paths_and_url_passwords():
    """An audit (2026-12-06) found `/home/John Smith/...` redacted to `<path> Smith/...`, `C:/Users/...`
    kept whole, and `http://user:pw@host` keeping the password."""
    r = Redactor()
    text = r.text("/home/John Smith/.local/share/swarmllm/models/x.gguf | C:\\Users\\John Smith\\AppData\\x.gguf | "
                  "C:/Users/alice/AppData/Local/swarmllm/x.gguf | http://bob:hunter2@10.1.2.3/x | see /usr/lib and /etc/x")
    assert text == "<path> | <path> | <path> | " + f"http://{r.ip('10.1.2.3')}/x | see <path> and <path>"
    assert "/v1/chat/completions and 12:30: ok" in r.text("/v1/chat/completions and 12:30: ok")
    # a line's figures after a path survive (a review: the first cut took the rest of the line as a path)
    assert r.text("loaded /home/u/models/x.gguf in 2.1 s at 12.5 tok/s") == "loaded <path> in 2.1 s at 12.5 tok/s"
    assert r.text("C:\\Users\\me\\x.gguf (3 GB) read at 10 MB/s") == "<path> (3 GB) read at 10 MB/s"
    assert r.text("C:\\Program Files (x86)\\swarm\\x.gguf ok") == "<path> ok"
    assert r.text("/home/u/x.gguf 12 MB/s") == "<path> 12 MB/s"
    # ...and long names with spaces go whole (a second review: a three-word cap left "Garcia Lopez")
    assert r.text("C:\\Users\\Maria Jose Garcia Lopez\\AppData\\x.gguf") == "<path>"
    assert r.text("/Users/Ana Maria de la Cruz/x.gguf") == "<path>"


def test_full_mode_keeps_addresses_but_not_the_key():
    r = Redactor(enabled=False, secrets_to_hide=[KEY])
    text = r.text(f"8.8.8.8:1 relay.example.com {KEY}")
    assert "8.8.8.8:1" in text and "relay.example.com" in text and KEY not in text


def test_structured_address_helper():
    r = Redactor()
    assert r.address("127.0.0.1", 8800) == "127.0.0.1:8800"
    assert re.fullmatch(r"<private-ip-[0-9a-f]{4}>:8810", r.address("192.168.0.2", 8810))
    assert re.fullmatch(r"<host-[0-9a-f]{4}>:8810", r.address("box.lan", 8810))


def test_hosts_the_suffix_list_does_not_know():
    r = Redactor(known_hosts=["mybox"])
    text = r.text("dial gpu-box.example.xyz:8810 and router.fritz.box:8810; mail ops@host.example.com; "
                  "url http://my-server.example.com/v1/models; bootstrap mybox:8810; odd 192.168.001.010:8810")
    for leaked in ("gpu-box", "fritz", "host.example.com", "my-server", "mybox", "192.168.001.010"):
        assert leaked not in text, leaked
    assert "http://<host-" in text and "/v1/models" in text
    assert re.search(r"<private-ip-[0-9a-f]{4}>:8810", text)


def test_module_line_locations_are_not_hosts():
    r = Redactor()
    text = r.text("arm=tests.node.test_diagnostics:hog_the_loop:12 arm=posixpath:_joinrealpath:451")
    assert "tests.node.test_diagnostics:hog_the_loop:12" in text


def test_e_mail_addresses_go_whole():
    """A bug hunt (2026-12-06): only an e-mail's domain was tagged (`ana.garcia@<host-…>`), and an
    e-mail followed by more of a file name (`ana.garcia@example.com-llama.gguf`) not even that."""
    r = Redactor()
    text = r.text("region=ana.garcia@example.com; cannot serve --model: ana.garcia@example.com-llama.gguf: truncated "
                  "GGUF header; mail ops@host.example.com.")
    assert "ana.garcia" not in text and "example.com" not in text and "ops@" not in text, text
    assert text.startswith("region=<email>; cannot serve --model: <email>") and text.endswith(" <email>.")
    assert r.text("hf://o/r/x.gguf@v1.0 and swarmllm-py/0.1.0") .endswith("x.gguf@v1.0 and swarmllm-py/0.1.0")


def test_paths_with_any_character_and_unc_and_repr_and_file_urls():
    """A bug hunt (2026-12-06): a name holding a colon (a `file:///home/<name>/...` URL taken as a
    relative path), a UNC path (`\\\\nas\\share\\<name>`), an OSError's repr of a Windows path (doubled
    backslashes) and a file: URL kept the user's name."""
    r = Redactor()
    cases = {
        "model file not found: /work/file:/home/ana.garcia/models/x.gguf (--model takes": "model file not found: ",
        "not found: /work/\\\\nas\\share\\ana.garcia\\x.gguf (x": "not found: <path> (x",
        "open \\\\nas\\Ana Garcia\\models\\x.gguf now": "open <path> now",
        "[Errno 2] No such file or directory: 'C:\\\\Users\\\\ana.garcia\\\\x.gguf'": "[Errno 2] No such file or directory: '<path>",
        "see file:///home/ana.garcia/x.gguf, then": "see <path>, then",
        "multiaddr /ip6/2001:db8::1/tcp/4001 ok": "multiaddr <path> ok",
    }
    for raw, start in cases.items():
        text = r.text(raw)
        assert "ana.garcia" not in text and "Garcia" not in text and "db8" not in text, text
        assert text.startswith(start), text
    assert r.text("cannot read /home/u/x.gguf: permission denied. Then /home/u/y.gguf.") == \
        "cannot read <path>: permission denied. Then <path>."


def test_mac_addresses():
    r = Redactor()
    assert r.text("mac 00:1A:2B:3C:4D:5E and 00-1a-2b-3c-4d-5e at 11:36:12") == "mac <mac> and <mac> at 11:36:12"


def test_url_credentials_and_query_go_in_both_forms():
    """A signed URL's query and a URL's password are credentials: gone from the full report too."""
    raw = "fetch https://ana:hunter2@10.1.2.3:8080/m/x.gguf?X-Amz-Signature=S3CRET#frag done"
    full = Redactor(enabled=False).text(raw)
    assert full == "fetch https://10.1.2.3:8080/m/x.gguf?… done"
    redacted = Redactor().text(raw)
    assert "hunter2" not in redacted and "S3CRET" not in redacted and "ana" not in redacted
    assert redacted.endswith(":8080/…/x.gguf?… done")  # its directories too (an account, a bucket)


@pytest.mark.parametrize("lead", ["-", "+", "...", "1.", "2-", "_"])
def test_a_url_glued_to_punctuation_or_a_number_loses_its_password_query_and_path(lead):
    """A scheme had to start its run of scheme characters (the linear pattern of review r67), so a
    URL right after `-`, `+`, `...` or `1.` (a server's or a library's words in an error) kept its
    password, its signed query and its directories, in both forms (review r70)."""
    raw = f"see {lead}https://ana:hunter2@10.0.0.5:8080/ana-garcia/private/m.gguf?X-Amz-Signature=S3CRET end"
    for text in (Redactor().text(raw), Redactor(enabled=False).text(raw)):
        assert "hunter2" not in text and "S3CRET" not in text, text
    redacted = Redactor(user_names=["ana"]).text(raw)
    assert "ana" not in redacted and "10.0.0.5" not in redacted and "private/" not in redacted, redacted


def test_a_cut_field_leaves_no_piece_of_a_spaced_path_or_name():
    """A field is cut before it is redacted (review r67); cut at its last space, a Windows path with
    the user's full name in it left the name's middle word after its `<path>` (review r70)."""
    from node.logs import clean_text, cut_for_redaction

    path = "C:\\Users\\Ana Maria Garcia\\models\\x.gguf"
    text = "load failed: " + ", ".join([path] * 40)
    r = Redactor(user_names=["Ana Maria Garcia"])
    for bound in range(200, 1200, 7):  # wherever the cut lands
        shown = clean_text(r.text(cut_for_redaction(text, bound)), bound)
        assert "Maria" not in shown and "Garcia" not in shown, (bound, shown)


def test_the_users_names_in_any_form():
    r = Redactor(user_names=["ana.garcia", "Ana Garcia", "ana-garcia", "me"],
                 salt=b"s" * 16, known_hosts=["gpu"])
    text = r.text("model=ana-garcia-llama-1a2b3c4d file ANA.GARCIA-x.gguf by Ana Garcia on gpu:8810 "
                  "me and anagarcia2 and banana.garcia")
    assert text.startswith("model=<user>-llama-1a2b3c4d file <user>-x.gguf by <user> on <host-")
    assert " me and anagarcia2 and banana.garcia" in text  # short names and other words stay
    tag = r.host("gpu")
    hexes = tag[len("<host-"):-1]
    r2 = Redactor(user_names=[hexes], salt=b"s" * 16, known_hosts=["gpu"])
    assert r2.text("gpu:1 and " + hexes) == f"{tag}:1 and <user>"  # a tag's hex is never a name
    assert Redactor(enabled=False, user_names=["ana.garcia"]).text("ana.garcia-llama") == "ana.garcia-llama"


def test_a_generic_login_is_no_name_to_hide():
    """A login such as `root`, `node` or `admin` names nobody, and is a word of the report itself:
    it made `<user>_id=` of every `node_id=` and `<user>` of every `node` in the report."""
    r = Redactor(user_names=["root", "node", "Admin", "ana.garcia"])
    assert r.text("node_id=abc model=x on node 1234 as root; admin; ana.garcia-x.gguf") == \
        "node_id=abc model=x on node 1234 as root; admin; <user>-x.gguf"


def test_figures_keys_and_near_api_paths_after_review():
    """Found in review (2026-12-06): a login `max` made `<user>_concurrent=` of every
    `max_concurrent=`; `0.93×/1.00×/1.07×` and `50%/60%/70%` became `0.93×<path>`; `/v1beta/...` and
    `/v1data/ana/...` were kept as our own API's paths."""
    r = Redactor(user_names=["max", "ram"])
    assert r.text("max_concurrent=4 max_tokens=512 ram_total_mb=8 as max") == \
        "max_concurrent=4 max_tokens=512 ram_total_mb=8 as <user>"
    figures = "ratios 0.93×/1.00×/1.07×, 50%/60%/70% (75%)/2/3 at 12.5 tok/s p50/p95/p99"
    assert Redactor().text(figures) == figures
    assert Redactor().text("`/home/ana/m.gguf` and /v1data/ana/x") == "`<path>` and <path>"
    assert Redactor().text("GET /v1/chat/completions and /api/admin/models") == \
        "GET /v1/chat/completions and /api/admin/models"
    assert "ana" not in Redactor().text("https://h.example/v1beta/ana/x.gguf")


def test_user_names_without_a_home_folder(monkeypatch):
    """No HOME and no passwd entry (a container run with an arbitrary uid): Path.home() raises, and
    the machine snapshot, so every diagnostics report, failed with it (found in review)."""
    from pathlib import Path

    from node import sysinfo

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert isinstance(sysinfo.user_names(), list)


# -- review r67 (2026-12-07): every pattern linear in its input, and a second pass changes nothing --

ADVERSARIAL = ["a.", "a-", "a+", "1.", "/a", "a@", "ab", "1:", "a://", "http://", "x@a.", "a.-", "[:", "1::%", "file:"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("unit", ADVERSARIAL)
def test_every_pattern_is_linear_on_long_runs(unit):
    """A URL pattern started at every `\\b`: "a.a.a…" (a GGUF's 64 KB architecture string quoted in
    an error) was scanned again from each letter, 17 s for one report. 200,000 characters of each
    run: seconds here, hours when any pattern is quadratic (the timeout is the guard)."""
    text = unit * (200_000 // len(unit))
    Redactor(salt=b"s" * 16, user_names=["anabel"], known_hosts=["mybox"], secrets_to_hide=[KEY]).text(text)


_PIECES = st.sampled_from([
    "https://nas.local/models/m.gguf", "http://[fd00::12]:8810/x", "http://bob:pw@10.1.2.3/a/b?sig=1#f",
    "gpu-box.example.xyz:8810", "8.8.8.8", "192.168.1.20:8810", "fe80::1%eth0", "[2001:db8::1]:1",
    "/home/anabel/x.gguf", "C:\\Users\\Anabel Ruiz\\x.gguf", "\\\\srv\\share\\x", "file:///tmp/x",
    "ana@example.com", "00:11:22:33:44:55", "anabel", "Anabel Ruiz", "mybox", "mac", "path", KEY,
    "<host-44a8>", "<private-ip-0b25>", "<public-ip-beef>", "<path>", "<email>", "<user>", "<mac>",
    "<api-key>", "127.0.0.1:8800", "localhost", "nas.local", "/v1/chat/completions", "?…", "/…/",
    "https://", "://", "http://<host-44a8>/…/x", "error", "x.gguf", "12.5 tok/s", "",
])
# (between words: two glued together, `8.8.8.8https://nas.local/a/b`, is one word that the first
# pass cuts in two, an address then a URL of its own; no report writes that)
_SEPARATORS = st.sampled_from([" ", "\n", "\t", ", ", " = ", "=", " '", "' ", " (", ") ", " [", "] ", "; ", ": "])


@given(st.lists(st.tuples(_SEPARATORS, _PIECES), max_size=12).map(lambda parts: "".join(a + b for a, b in parts)))
@settings(max_examples=400, deadline=None)
def test_a_second_pass_changes_nothing(text):
    """The report redacts a field, then its row, then the whole text: `https://<host-44a8>/` read as
    a URL on the second pass and its tag was tagged again (one host, three tags in one report; a
    private IP in a URL became a `<host-…>`)."""
    r = Redactor(salt=b"s" * 16, user_names=["anabel", "Anabel Ruiz", "mac", "path"], known_hosts=["mybox", "path"],
                 secrets_to_hide=[KEY])
    once = r.text(text)
    assert r.text(once) == once
