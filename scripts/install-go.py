#!/usr/bin/env python3
"""Install a Go toolchain the way the go command fetches one (GOTOOLCHAIN): the module
golang.org/toolchain@v0.0.1-goVERSION.linux-ARCH from the Go module proxy, checked against the
Go checksum database (through the proxy, as the go command reaches it), unpacked into PREFIX.

    install-go.py VERSION PREFIX      e.g. install-go.py 1.26.8 /usr/local/go

Used by scripts/setup.sh on a machine with no Go (Debian 12's golang-go, 1.19, is too old to
fetch a newer toolchain itself). GOPROXY is honoured (its first http(s) entry). Exits 1 with
one line on stderr when the download fails or its hash differs from the database's."""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}


def proxy() -> str:
    for p in (
        os.environ.get("GOPROXY", "https://proxy.golang.org")
        .replace("|", ",")
        .split(",")
    ):
        if p.startswith(("https://", "http://")):
            return p.rstrip("/")
    return "https://proxy.golang.org"


def fetch(url: str, to: Path | None = None) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        if to is None:
            return r.read()
        with to.open("wb") as f:
            shutil.copyfileobj(r, f)
    return b""


def h1(zip_path: Path) -> str:
    """The checksum database's h1: hash of a module zip (golang.org/x/mod/sumdb/dirhash)."""
    lines = []
    with zipfile.ZipFile(zip_path) as z:
        for name in sorted(z.namelist()):
            lines.append(f"{hashlib.sha256(z.read(name)).hexdigest()}  {name}\n")
    return (
        "h1:"
        + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode()
    )


def main(version: str, prefix: str) -> int:
    arch = ARCHES.get(platform.machine())
    if arch is None:
        print(
            f"install-go: no Go toolchain for {platform.machine()}; install Go by hand",
            file=sys.stderr,
        )
        return 1
    mod = f"golang.org/toolchain@v0.0.1-go{version}.linux-{arch}"
    path, ver = mod.split("@")
    base = proxy()
    dest = Path(prefix)
    with tempfile.TemporaryDirectory(prefix="fpgo") as tmp:
        zp = Path(tmp) / "go.zip"
        try:
            fetch(f"{base}/{path}/@v/{ver}.zip", zp)
            lookup = fetch(f"{base}/sumdb/sum.golang.org/lookup/{mod}").decode()
        except OSError as e:
            print(f"install-go: download of {mod} from {base}: {e}", file=sys.stderr)
            return 1
        want = next(
            (
                ln.split()[2]
                for ln in lookup.splitlines()
                if ln.startswith(f"{path} {ver} h1:")
            ),
            None,
        )
        got = h1(zp)
        if want != got:
            print(
                f"install-go: {mod}: hash {got}, the checksum database says {want}",
                file=sys.stderr,
            )
            return 1
        with zipfile.ZipFile(zp) as z:
            z.extractall(tmp)
        root = Path(tmp) / mod
        # Module zips keep no file modes: the go command marks these executable as it unpacks.
        for d in [root / "bin", *(root / "pkg" / "tool").glob("*")]:
            for f in d.iterdir():
                f.chmod(0o755)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(root, dest)
    print(f"install-go: Go {version} in {dest}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
