"""A real Flower deployment on this machine: one ``flower-superlink`` and N ``flower-supernode``
processes on 127.0.0.1, and ``flwr run`` of a fedrl Flower App against them.

This is what ``docs/flower.md`` describes step by step, as a context manager for tests and for
trying a deployment out. ``secure=True`` (the default) runs it as a deployment should run: TLS on
every connection (a throw-away certificate authority made here) and SuperNode authentication (each
SuperNode's public key registered with ``flwr supernode register``; an unregistered SuperNode is
refused). ``secure=False`` is the insecure mode, for local tests only.

Every process is started in a process group of its own and torn down with it on exit.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["LocalDeployment", "make_certificates", "make_supernode_key", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _executable(name: str) -> str:
    here = pathlib.Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: install the flower extra (pip install 'fedrl[flower]')")
    return found


def make_certificates(directory: str | pathlib.Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> dict[str, pathlib.Path]:
    """A certificate authority and a server certificate for ``hosts`` (PEM files in ``directory``).

    :return: paths ``ca`` (the CA certificate the clients trust), ``certificate`` and ``key`` (the SuperLink's)
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedrl local CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    certificate = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": directory / "ca.crt", "certificate": directory / "server.pem", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["certificate"].write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def make_supernode_key(directory: str | pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A SuperNode's authentication key pair (ECDSA P-384, OpenSSH format, as ``ssh-keygen -t ecdsa -b 384``).

    :return: the private and the public key file
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / name, directory / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    private.chmod(0o600)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


class LocalDeployment:
    """A SuperLink and ``n_supernodes`` SuperNodes on 127.0.0.1 (see the module docstring).

    >>> with LocalDeployment(workdir, n_supernodes=4) as deployment:  # doctest: +SKIP
    ...     deployment.run(app_dir)

    :param workdir: directory for logs, keys, certificates and Flower's home (``FLWR_HOME``)
    :param n_supernodes: SuperNodes, agent ``i`` on the ``i``-th (node config ``partition-id=i``)
    :param secure: TLS and SuperNode authentication (``False``: insecure mode, local tests only)
    :param unregistered_supernodes: extra SuperNodes started with keys the SuperLink does not know
        (to check they are refused; ``secure`` only)
    :param startup_timeout: seconds to wait for the processes to come up
    """

    def __init__(
        self, workdir: str | pathlib.Path, n_supernodes: int, secure: bool = True, unregistered_supernodes: int = 0,
        startup_timeout: float = 60.0,
    ) -> None:
        if isinstance(n_supernodes, bool) or not isinstance(n_supernodes, int) or n_supernodes < 1:
            raise ValueError(f"n_supernodes must be an int >= 1, got {n_supernodes!r}")
        if unregistered_supernodes and not secure:
            raise ValueError("unregistered_supernodes needs secure=True (without authentication every SuperNode is admitted)")
        # Absolute: the processes run in the work directory, and every path handed to them (the
        # certificates, keys, the app) must mean the same there as here.
        self.workdir = pathlib.Path(workdir).resolve()
        self.n_supernodes = n_supernodes
        self.secure = bool(secure)
        self.unregistered = int(unregistered_supernodes)
        self.startup_timeout = float(startup_timeout)
        self.port = free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.certificates: dict[str, pathlib.Path] = {}

    @property
    def address(self) -> str:
        """The SuperLink's address (Fleet and Control APIs)."""
        return f"127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """The environment of the Flower processes and CLI calls: ``FLWR_HOME`` in the work directory,
        and the running interpreter's scripts first on ``PATH`` (the SuperLink starts
        ``flower-superexec`` by name, which an interpreter's virtualenv that is not activated lacks)."""
        scripts = str(pathlib.Path(sys.executable).parent)
        path = os.pathsep.join([scripts, os.environ.get("PATH", "")]) if os.environ.get("PATH") else scripts
        return {**os.environ, "FLWR_HOME": str(self.home), "PYTHONUNBUFFERED": "1", "PATH": path}

    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process in stop()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environment(), cwd=self.workdir,
                                   start_new_session=True)
        process._fedrl_log = log  # type: ignore[attr-defined]
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        """The output of process ``name`` so far (``superlink``, ``supernode-0``, ...)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = ['[superlink]', 'default = "local-deployment"', '', '[superlink.local-deployment]', f'address = "{self.address}"']
        lines.append(f'root-certificates = "{self.certificates["ca"]}"' if self.secure else "insecure = true")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def _wait_for_port(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.processes["superlink"].poll() is not None:
                raise RuntimeError(f"flower-superlink exited:\n{self.log('superlink')[-3000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"flower-superlink did not listen on {self.address} within {self.startup_timeout:.0f} s")

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this deployment."""
        return subprocess.run([_executable("flwr"), *args], env=self.environment(), cwd=self.workdir, capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> LocalDeployment:
        """Start the SuperLink, register the SuperNodes' keys (secure mode) and start the SuperNodes."""
        self.logs.mkdir(parents=True, exist_ok=True)
        link = [_executable("flower-superlink"), "--port", str(self.port), "--disable-runtime-dependency-installation"]
        if self.secure:
            self.certificates = make_certificates(self.workdir / "certificates")
            link += ["--ssl-ca-certfile", str(self.certificates["ca"]), "--ssl-certfile", str(self.certificates["certificate"]),
                     "--ssl-keyfile", str(self.certificates["key"]), "--enable-supernode-auth"]
        else:
            link.append("--insecure")
        self._write_config()
        self._start("superlink", link)
        self._wait_for_port()
        for i in range(self.n_supernodes + self.unregistered):
            name = f"supernode-{i}" if i < self.n_supernodes else f"unregistered-{i - self.n_supernodes}"
            node = [_executable("flower-supernode"), "--superlink", self.address, "--port", str(free_port()),
                    "--node-config", f"partition-id={min(i, self.n_supernodes - 1)} num-partitions={self.n_supernodes}"]
            if self.secure:
                private, public = make_supernode_key(self.workdir / "keys", name)
                if i < self.n_supernodes:
                    done = self.flwr("supernode", "register", str(public), "local-deployment")
                    if done.returncode != 0:
                        raise RuntimeError(f"flwr supernode register failed:\n{done.stdout}\n{done.stderr}")
                node += ["--root-certificates", str(self.certificates["ca"]), "--auth-supernode-private-key", str(private)]
            else:
                node.append("--insecure")
            self._start(name, node)
        return self

    def run(self, app_dir: str | pathlib.Path, run_config: dict[str, Any] | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``flwr run APP_DIR local-deployment --stream`` (waits for the run to end).

        :param app_dir: a Flower App directory (``fedrl flower app``), relative to the caller's
            working directory or absolute
        :param run_config: run config overrides (``{"num-rounds": 3}``)
        :param timeout: seconds before the run is abandoned
        :return: the finished ``flwr run`` (its output in ``stdout``)
        :raise RuntimeError: when the run fails, with the end of its output
        """
        args = ["run", str(pathlib.Path(app_dir).resolve()), "local-deployment", "--stream"]
        for key, value in (run_config or {}).items():
            text = f'"{value}"' if isinstance(value, str | pathlib.Path) else str(value).lower() if isinstance(value, bool) else str(value)
            args += ["--run-config", f"{key}={text}"]
        done = self.flwr(*args, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"flwr run {app_dir} failed (exit code {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
        return done

    def stop(self) -> None:
        """Terminate every process this deployment started (their whole process groups)."""
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            try:  # children (flower-superexec, ClientApps) share the group and outlive a SIGTERM'd parent
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process._fedrl_log.close()  # type: ignore[attr-defined]
        self.processes.clear()

    def __enter__(self) -> LocalDeployment:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()
