"""Redaction: every address or host becomes a kind-naming, per-report salted tag."""

import re

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
