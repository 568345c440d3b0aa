"""Entry point of both bundled programs: `swarmllm` (the CLI and headless node) and `swarmllm-tray`
(the desktop app). One script, two executables built from it (swarmllm.spec): which one runs is
decided by the executable's name."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def ensure_std_streams() -> None:
    """A windowed executable (the tray on Windows, the .app on macOS) starts without stdout and
    stderr; llama.cpp's quiet mode duplicates file descriptors 1 and 2, and logging writes to
    sys.stderr. Point whatever is missing at the null device."""
    if sys.stdout is not None and sys.stderr is not None:
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(null, fd)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


# where Linux distributions keep their CA bundle (Go's crypto/x509 list, the common part)
SYSTEM_CA_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Arch, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # RHEL 7+
    "/etc/ssl/cert.pem",  # Alpine
)


def ensure_ca_roots(environ=os.environ, defaults=None, candidates=SYSTEM_CA_FILES) -> str | None:
    """The bundle carries the build machine's libssl, which looks for CA certificates where the
    build's distribution keeps them (Debian's: /usr/lib/ssl). On a distribution without that
    folder (Fedora, Arch, openSUSE) every HTTPS download failed with CERTIFICATE_VERIFY_FAILED.
    When neither SSL_CERT_FILE/SSL_CERT_DIR is set nor the compiled-in place exists, point
    SSL_CERT_FILE at this system's bundle, or at certifi's in the bundle. Returns what it set."""
    if not getattr(sys, "frozen", False) or sys.platform != "linux":
        return None
    if environ.get("SSL_CERT_FILE") or environ.get("SSL_CERT_DIR"):
        return None
    import ssl

    paths = defaults or ssl.get_default_verify_paths()
    if (paths.openssl_cafile and os.path.isfile(paths.openssl_cafile)) or \
            (paths.openssl_capath and os.path.isdir(paths.openssl_capath) and os.listdir(paths.openssl_capath)):
        return None
    bundled = os.path.join(getattr(sys, "_MEIPASS", ""), "certifi", "cacert.pem")
    for path in (*candidates, bundled):
        if os.path.isfile(path):
            environ["SSL_CERT_FILE"] = path
            return path
    return None


def main() -> int:
    ensure_std_streams()
    ensure_ca_roots()
    if Path(sys.executable).stem.lower().startswith("swarmllm-tray"):
        from app.main import main as tray_main

        return tray_main()
    from node.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
