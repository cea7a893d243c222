"""Servers for collect's tests and benchmark: a real S3-compatible server (moto's), and real
`flowplane altmark probe run` processes: N probes in one network namespace of their own
(fp-prefixed), each on a veth interface of its own and serving its REST API on a non-loopback
address (198.18.0.1, one port each) with a bearer token, plus an optional UDP sender so their
records hold samples. The probes need root and bin/flowplane (`make build`). Everything made
here is removed by close()."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLOWPLANE = REPO / "bin" / "flowplane"
API_ADDR = "198.18.0.1"
BASE_PORT = 20000


def need_root() -> str | None:
    """Why the farm cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, BPF)"
    if not FLOWPLANE.exists():
        return f"needs {FLOWPLANE}: run make build"
    return None


def moto_server() -> tuple[subprocess.Popen, str]:
    """A real S3-compatible server (moto's) on a free loopback port: (process, endpoint URL)
    once it answers."""
    import socket

    import requests

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            requests.get(url, timeout=1)
            return proc, url
        except requests.RequestException:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({proc.returncode})") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not answer in 60 s")


def s3_env(endpoint: str) -> dict[str, str]:
    """The AWS settings (storage.py) of a moto server."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "fptest",
        "AWS_SECRET_ACCESS_KEY": "fptestsecret",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def _ip(*args: str, input: str | None = None) -> None:
    subprocess.run(["ip", *args], check=True, input=input, text=True, capture_output=True)


# The sender: UDP datagrams to every probe's dummy interface, round robin, at a fixed rate.
_SENDER = """
import socket, sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dsts = [(f"198.19.{i // 250}.{i % 250 + 1}", 9000 + i) for i in range(n)]
gap, t, k = 1.0 / rate, time.monotonic(), 0
while True:
    for p in range(7):
        s.sendto(b"x" * 64, (dsts[k % n][0], dsts[k % n][1] + 1000 * p))
    k += 1
    t += gap
    d = t - time.monotonic()
    if d > 0:
        time.sleep(d)
"""


class Farm:
    """n probes recording `periods` periods of `period_ms` each, then serving them."""

    def __init__(
        self,
        workdir: Path,
        n: int,
        token: str,
        periods: int = 4,
        period_ms: int = 100,
        rate: float = 0.0,
        nmax: int = 64,
    ) -> None:
        self.workdir, self.n, self.token, self.periods = Path(workdir), n, token, periods
        self.ns = f"fpsc{os.getpid() % 100000}x{int(time.time() * 1000) % 100000}"
        self.procs: list[subprocess.Popen] = []
        self.extra: list[subprocess.Popen] = []
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token_file = self.workdir / "token"
        self.token_file.write_text(token + "\n")
        _ip("netns", "add", self.ns)
        try:
            self._up(n, periods, period_ms, rate, nmax)
        except BaseException:
            self.close()
            raise

    def _up(self, n: int, periods: int, period_ms: int, rate: float, nmax: int) -> None:
        # veth pairs (this kernel has no dummy interfaces): the probe counts at fpd<i>'s
        # egress; the peer fpe<i> drops what arrives (not its address). Permanent neighbour
        # entries, so the sender's datagrams leave without ARP.
        cmds = ["link set lo up", "link add fpapi type veth peer name fpapip"]
        cmds += ["link set fpapi up", "link set fpapip up", f"addr add {API_ADDR}/32 dev fpapi"]
        for i in range(n):
            dst = f"198.19.{i // 250}.{i % 250 + 1}"
            cmds += [
                f"link add fpd{i} type veth peer name fpe{i}",
                f"link set fpd{i} up",
                f"link set fpe{i} up",
                f"route add {dst}/32 dev fpd{i}",
                f"neigh add {dst} lladdr 02:00:00:00:00:01 dev fpd{i} nud permanent",
            ]
        _ip("-n", self.ns, "-batch", "-", input="\n".join(cmds) + "\n")
        for i in range(n):
            cfg = self.workdir / f"p{i:03d}.yaml"
            cfg.write_text(
                f"probe_id: p{i:03d}\n"
                f"interfaces: [{{name: fpd{i}, direction: out}}]\n"
                f"period: {period_ms}ms\nperiods: {periods}\n"
                f"carrier: dscp\nprotocols: [udp]\nhash_bits: 2\nnmax: {nmax}\n"
                f"data_dir: {self.data_dir(i)}\n"
            )
            self.procs.append(
                self.start(
                    str(FLOWPLANE),
                    "altmark",
                    "probe",
                    "run",
                    "--config",
                    str(cfg),
                    "--listen",
                    f"{API_ADDR}:{BASE_PORT + i}",
                    "--token-file",
                    str(self.token_file),
                    log=self.workdir / f"p{i:03d}.log",
                )
            )
        if rate:
            self.extra.append(self.start(sys.executable, "-c", _SENDER, str(n), str(rate)))

    def start(self, *cmd: str, log: Path | None = None, **kw: object) -> subprocess.Popen:
        """A process in the farm's namespace."""
        out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *cmd], stdout=out, stderr=subprocess.STDOUT, **kw
        )

    def data_dir(self, i: int) -> Path:
        return self.workdir / f"p{i:03d}-data"

    def url(self, i: int) -> str:
        return f"http://{API_ADDR}:{BASE_PORT + i}"

    def wait_recorded(self, timeout: float = 300.0) -> None:
        """Until every probe has finished its periods (a period read late is skipped, not
        recorded: what a probe serves is what its data_dir holds)."""
        end = time.monotonic() + timeout
        left = set(range(self.n))
        while time.monotonic() < end:
            for i in sorted(left):
                log = (self.workdir / f"p{i:03d}.log").read_text()
                if "finished its periods" in log:
                    left.discard(i)
                elif self.procs[i].poll() is not None:
                    raise RuntimeError(f"probe p{i:03d} exited: {log[-2000:]}")
            if not left:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{len(left)} probes have not finished {self.periods} periods")

    def recorded(self, i: int) -> list[int]:
        """The periods probe i recorded."""
        return sorted(
            int(d.name.removeprefix("period="))
            for d in self.data_dir(i).glob("counters/*/period=*")
            if (d / "part-0.parquet").exists()
        )

    def rss_kib(self) -> list[int]:
        """Each probe process's resident memory (KiB)."""
        out = []
        for p in self.procs:
            # ip netns exec execs the command: the process is the probe itself.
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]))
        return out

    def close(self) -> None:
        for p in self.extra + self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.extra + self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "del", self.ns], check=False, capture_output=True)
