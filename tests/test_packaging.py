"""Packaging (DESIGN.md §11): what can be checked without building the 1 GB bundle.

The bundle itself is built and smoke-tested by `packaging/build_linux.sh` (PyInstaller, then
`packaging/smoke.py`: both programs serve the default model from the bundle alone); that takes
minutes and ~1 GB, so it is not part of this suite. Here: the spec names every module the CLI
loads by name, the one entry script starts the right program for each executable's name, and the
Linux installer installs and removes a bundle for a user (run for real, in a temporary HOME).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGING = ROOT / "packaging"


def test_spec_names_every_module_the_cli_imports_by_name():
    from node.cli import SUBCOMMANDS

    spec = (PACKAGING / "swarmllm.spec").read_text()
    hidden = set(re.findall(r'"([\w.]+)"', spec.split("hiddenimports = [", 1)[1].split("]", 1)[0]))
    missing = [name for name in SUBCOMMANDS if name not in hidden]
    assert not missing, f"swarmllm.spec's hiddenimports lack {missing}: the bundled CLI would not have them"
    # data the frozen node reads through node.resources (sys._MEIPASS/resources)
    assert '(str(ROOT / "resources"), "resources")' in spec


@pytest.mark.parametrize(("exe_name", "expected"), [
    ("swarmllm", "cli"), ("swarmllm.exe", "cli"), ("swarmllm-tray", "tray"), ("swarmllm-tray.exe", "tray"),
])
def test_entry_script_starts_the_program_its_executable_is_named_for(monkeypatch, exe_name, expected):
    import app.main
    import node.cli

    sys.path.insert(0, str(PACKAGING))
    try:
        import entry
    finally:
        sys.path.remove(str(PACKAGING))
    ran = []
    monkeypatch.setattr(node.cli, "main", lambda: ran.append("cli") or 0)
    monkeypatch.setattr(app.main, "main", lambda: ran.append("tray") or 0)
    monkeypatch.setattr(sys, "executable", f"/opt/swarmllm/{exe_name}")
    assert entry.main() == 0
    assert ran == [expected]


# Run where a windowed executable starts: file descriptors 1 and 2 closed, so Python itself sets
# sys.stdout and sys.stderr to None (pytest's own process always has them open).
_WINDOWED_CHILD = """
import json, logging, os, sys, traceback
result = {"before": [sys.stdout is None, sys.stderr is None]}
try:
    sys.path.insert(0, sys.argv[1])
    import entry
    entry.ensure_std_streams()
    result["after"] = [sys.stdout is None, sys.stderr is None]
    print("goes nowhere")
    print("goes nowhere", file=sys.stderr)
    logging.basicConfig()
    logging.getLogger("x").warning("what logging's handler does")
    result["fds"] = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}
    result["dup"] = [os.dup(fd) > 2 for fd in (1, 2)]  # what llama.cpp's quiet mode does
except BaseException:  # no stderr to tell: the report carries the traceback
    result["error"] = traceback.format_exc()
with open(sys.argv[2], "w") as out:
    json.dump(result, out)
"""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
def test_entry_script_gives_a_windowed_program_std_streams(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" "$2" "$3" 0<&- 1>&- 2>&-', sys.executable,
                           _WINDOWED_CHILD, str(PACKAGING), str(report)], timeout=60)
    result = json.loads(report.read_text())
    assert "error" not in result, result["error"]
    assert done.returncode == 0
    assert result["before"] == [True, True]  # the condition under test really held
    assert result["after"] == [False, False]
    assert result["fds"] == {"0": os.devnull, "1": os.devnull, "2": os.devnull}
    assert result["dup"] == [True, True]


def test_entry_script_leaves_existing_std_streams_alone(monkeypatch):
    sys.path.insert(0, str(PACKAGING))
    try:
        import entry
    finally:
        sys.path.remove(str(PACKAGING))
    out, err = sys.stdout, sys.stderr
    entry.ensure_std_streams()
    assert sys.stdout is out and sys.stderr is err


def _fake_bundle(tmp_path: Path) -> Path:
    """A folder shaped like dist/swarmllm (tiny scripts stand in for the two programs)."""
    bundle = tmp_path / "unpacked" / "swarmllm"
    (bundle / "_internal" / "resources" / "icons").mkdir(parents=True)
    shutil.copy(ROOT / "resources" / "icons" / "swarmllm.png", bundle / "_internal" / "resources" / "icons")
    for name in ("swarmllm", "swarmllm-tray"):
        exe = bundle / name
        exe.write_text(f"#!/bin/sh\necho {name} \"$@\"\n")
        exe.chmod(0o755)
    shutil.copy(PACKAGING / "linux" / "install.sh", bundle)
    shutil.copy(PACKAGING / "linux" / "swarmllm.desktop", bundle)
    return bundle


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux installer")
def test_linux_installer_installs_for_the_user_and_uninstalls(tmp_path):
    bundle = _fake_bundle(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    done = subprocess.run(["sh", str(bundle / "install.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    opt = home / ".local" / "opt" / "swarmllm"
    apps = home / ".local" / "share" / "applications" / "swarmllm.desktop"
    autostart = home / ".config" / "autostart" / "swarmllm.desktop"
    icon = home / ".local" / "share" / "icons" / "hicolor" / "256x256" / "apps" / "swarmllm.png"
    for path in (opt / "swarmllm-tray", apps, autostart, icon):
        assert path.exists(), path
    entry = apps.read_text()
    assert f'Exec="{opt}/swarmllm-tray"\n' in entry and "Icon=swarmllm\n" in entry
    # the commands on PATH run the installed copy, not the unpacked one
    shutil.rmtree(bundle.parent)
    out = subprocess.run([str(home / ".local" / "bin" / "swarmllm"), "run", "-p", "9"], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == "swarmllm run -p 9"

    # running the installed copy's installer again keeps it (no self-deletion), through another
    # spelling of the same folder too
    again = subprocess.run(["sh", str(home / ".local" / "opt" / ".." / "opt" / "swarmllm" / "install.sh")], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (opt / "swarmllm-tray").exists()
    # a `swarmllm` that is not ours (a pip --user install) is left alone, now and at uninstall
    ours = home / ".local" / "bin" / "swarmllm"
    ours.unlink()
    ours.write_text("#!/bin/sh\necho pip\n")
    done = subprocess.run(["sh", str(opt / "install.sh"), "--uninstall"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert ours.read_text() == "#!/bin/sh\necho pip\n"
    ours.unlink()
    left = [p for p in home.rglob("*") if "swarmllm" in p.name]
    assert left == []


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux installer")
def test_linux_installer_refuses_to_run_outside_a_bundle(tmp_path):
    lonely = tmp_path / "install.sh"
    shutil.copy(PACKAGING / "linux" / "install.sh", lonely)
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(["sh", str(lonely)], env={"HOME": str(home), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unpacked SwarmLLM folder" in done.stderr
    assert not (home / ".local").exists()


def _reads_own_metadata_at_import(init: Path, dist: str) -> bool:
    """Whether a package's __init__ calls importlib.metadata's version()/distribution() at module
    level (as llguidance's does): in a bundle without the dist-info that import raises."""
    text = init.read_text(errors="replace")
    if "metadata" not in text:
        return False
    call = re.compile(r"^[A-Za-z_][\w.]*\s*=\s*[\w.]*(?:version|distribution)\(\s*['\"]([\w.-]+)['\"]", re.MULTILINE)
    norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()  # noqa: E731
    return any(norm(m.group(1)) == norm(dist) for m in call.finditer(text))


def test_spec_copies_the_metadata_of_packages_that_read_it_when_imported():
    """PyInstaller bundles modules, not dist-info: a package that asks importlib.metadata for its own
    version at import fails to import in the bundle. llguidance does, and every response_format or
    tool request of the bundled node was a 500 (found by packaging/smoke.py, 2026-12-07)."""
    import importlib.metadata as md
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["gui"]]
    dists = {re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0] for req in wanted}
    spec = (PACKAGING / "swarmllm.spec").read_text()
    copied = set(re.findall(r'copy_metadata\("([\w.-]+)"\)', spec))
    needing = []
    for dist in sorted(dists):
        try:
            files = md.distribution(dist).files or []
        except md.PackageNotFoundError:
            continue  # not installed here (an optional platform's)
        for f in files:
            if f.name == "__init__.py" and len(f.parts) == 2 and _reads_own_metadata_at_import(Path(f.locate()), dist):
                needing.append(dist)
                break
    assert "llguidance" in needing  # the scan sees the case it is written for
    missing = [d for d in needing if d not in copied]
    assert not missing, f"swarmllm.spec does not copy_metadata({missing}): they fail to import in the bundle"


# A bundle's TLS client on a distribution that keeps its CA bundle elsewhere than the build's
# libssl looks: `entry.ensure_ca_roots` with the compiled-in places missing (as on Fedora or Arch
# for a bundle built on Debian), then a real HTTPS request to a server whose CA is only in the
# system's bundle file.
_CA_CHILD = """
import json, os, ssl, sys, types, urllib.request
sys.path.insert(0, sys.argv[1])
import entry
sys.frozen = True
def get():
    try:
        with urllib.request.urlopen(sys.argv[4], timeout=30, context=ssl.create_default_context()) as r:
            return r.status
    except Exception as exc:
        return type(exc).__name__ + ": " + str(exc)
before = get()
nowhere = types.SimpleNamespace(openssl_cafile=sys.argv[2] + "/none/cert.pem", openssl_capath=sys.argv[2] + "/none")
chosen = entry.ensure_ca_roots(os.environ, nowhere, (sys.argv[2] + "/absent.crt", sys.argv[3]))
print(json.dumps({"before": before, "chosen": chosen, "after": get()}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the Linux bundle's CA lookup")
def test_bundle_finds_the_systems_ca_roots_where_its_libssl_does_not_look(tmp_path):
    import datetime
    import http.server
    import ipaddress
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "packaging test root")])
    valid = {"not_valid_before": now - datetime.timedelta(hours=1), "not_valid_after": now + datetime.timedelta(hours=1)}
    ca = (x509.CertificateBuilder(subject_name=root, issuer_name=root, public_key=ca_key.public_key(), serial_number=1,
                                  **valid).add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                                    issuer_name=root, public_key=key.public_key(), serial_number=2, **valid)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(ca_key, hashes.SHA256()))
    system_bundle = tmp_path / "ca-bundle.crt"
    system_bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "leaf.pem")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
        url = f"https://127.0.0.1:{server.server_address[1]}/"
        done = subprocess.run([sys.executable, "-c", _CA_CHILD, str(PACKAGING), str(tmp_path), str(system_bundle), url],
                              env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "CERTIFICATE_VERIFY_FAILED" in str(result["before"])  # the CA is only in the "system's" file
    assert result["chosen"] == str(system_bundle)
    assert result["after"] == 200
