"""A Dask cluster only its owner can use (apsat.pipeline.batch_dask): the batch runs over
tls:// with certificates, a client without them is turned away, a plain tcp:// scheduler
off this machine is refused before any connection, and a result computed by other apsat
source than the caller's is not stored."""
from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest
from models import elementwise_chain

distributed = pytest.importorskip("distributed", reason="the dask executor needs distributed (apsat[dask])")
pytest.importorskip("cryptography", reason="temporary TLS credentials need cryptography")

import dask  # noqa: E402
from distributed import Security  # noqa: E402

from apsat.cli import main  # noqa: E402
from apsat.errors import ApsatError  # noqa: E402
from apsat.pipeline import store as store_mod  # noqa: E402
from apsat.pipeline.batch import Task  # noqa: E402
from apsat.pipeline.batch_dask import check_scheduler, load_security, local_cluster, run_dask  # noqa: E402
from apsat.pipeline.store import ResultStore  # noqa: E402

OFF_MACHINE = "tcp://10.255.255.1:8786"       # never contacted: refused before connecting


@pytest.fixture(scope="module")
def tls():
    """One non-daemonic worker process on loopback, over tls:// with temporary
    credentials; yields (cluster, its Security)."""
    sec = Security.temporary()
    with local_cluster(1, security=sec) as cluster:
        yield cluster, sec


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A small element-wise model and a file that is not ONNX."""
    root = tmp_path_factory.mktemp("models")
    onnx.save(elementwise_chain(), str(root / "chain.onnx"))
    (root / "bad.onnx").write_bytes(b"not onnx")
    return root


def _tasks(models, out):
    return [Task(name, str(models / f"{name}.onnx"), out=str(out)) for name in ("chain", "bad")]


def _security_file(sec: Security, folder) -> str:
    """`sec`'s credentials as PEM files and a security file naming them (relative paths)."""
    for name, pem in (("ca.pem", sec.tls_ca_file), ("cert.pem", sec.tls_client_cert), ("key.pem", sec.tls_client_key)):
        (folder / name).write_text(pem)
    (folder / "security.yaml").write_text("ca_file: ca.pem\ncert: cert.pem\nkey: key.pem\n")
    return str(folder / "security.yaml")


@pytest.fixture
def no_connection(monkeypatch):
    """distributed.Client replaced: the addresses it was asked for, and OSError."""
    asked = []

    def refuse(address, **kw):
        asked.append(address)
        raise OSError("no connection in this test")

    monkeypatch.setattr(distributed, "Client", refuse)
    return asked


def test_the_batch_runs_over_tls_and_is_reused(tls, models, tmp_path):
    cluster, sec = tls
    assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
    store = ResultStore(tmp_path)
    rows = run_dask(_tasks(models, tmp_path), cluster.scheduler_address, security=sec, store=store, timeout=60)
    assert [(r["model"], r["status"]) for r in rows] == [("chain", "ok"), ("bad", "error")]
    assert rows[0]["kernels"] > 0 and "not an ONNX file" in rows[1]["error"]
    assert rows[0]["source_digest"] == store_mod.source_digest() and not rows[0]["notices"]
    assert (tmp_path / "chain" / "report.json").is_file()
    again = run_dask(_tasks(models, tmp_path)[:1], cluster.scheduler_address, security=sec, store=store)
    assert again[0]["status"] == "reused" and again[0]["kernels"] == rows[0]["kernels"]


# One connection attempt in a process of its own: distributed's client event loop is
# shared within a process, and a refused client can leave it unable to start the next one,
# which would make the second attempt fail for a reason other than its credentials.
_ATTEMPT = """
import sys
from distributed import Client, Security
addr, how = sys.argv[1], sys.argv[2]
try:
    c = Client(addr, timeout=5, **({"security": Security.temporary()} if how == "other-ca" else {}))
except Exception as e:
    print("refused:", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    sys.exit(0)
print("connected")
c.close()
sys.exit(1)
"""


@pytest.mark.parametrize("how, reason", [
    ("none", "ssl_context"),                          # no certificate at all
    ("other-ca", "TLS certificate does not match"),   # another CA's
])
def test_clients_without_the_credentials_are_turned_away(tls, how, reason):
    cluster, _ = tls
    done = subprocess.run([sys.executable, "-c", _ATTEMPT, cluster.scheduler_address, how],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("refused:"), done.stdout + done.stderr[-2000:]
    assert reason in done.stdout


def test_run_dask_with_other_credentials_is_one_line(tls, models, tmp_path):
    cluster, _ = tls
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}), \
            pytest.raises(ApsatError, match="^cannot reach the Dask scheduler at tls://"):
        run_dask(_tasks(models, tmp_path), cluster.scheduler_address, security=Security.temporary())


def test_the_cli_runs_over_tls_with_a_security_file(tls, models, tmp_path, capsys):
    cluster, sec = tls
    security = _security_file(sec, tmp_path)
    status = main(["zoo", str(models / "chain.onnx"), "--out", str(tmp_path / "out"), "--executor", "dask",
                   "--scheduler", cluster.scheduler_address, "--security", security])
    assert status == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "chain" / "report.json").read_text())["verification"]["ok"]


def test_a_result_from_other_apsat_source_is_not_stored(tls, models, tmp_path, monkeypatch):
    """The workers run this checkout; the caller here claims another source digest."""
    cluster, sec = tls
    monkeypatch.setattr(store_mod, "source_digest", lambda root=None: "0" * 64)
    store = ResultStore(tmp_path)
    rows = run_dask(_tasks(models, tmp_path)[:1], cluster.scheduler_address, security=sec, store=store)
    assert rows[0]["status"] == "ok" and rows[0]["notices"] == [store_mod.OTHER_SOURCE]
    assert not store.root.exists()


@pytest.mark.parametrize("address", [OFF_MACHINE, "10.255.255.1:8786", "tcp://example.org:8786",
                                     "tcp://0.0.0.0:8786", "ws://10.255.255.1:8786"])
def test_plain_tcp_off_this_machine_is_refused_before_connecting(address, models, tmp_path, capsys,
                                                                 no_connection):
    status = main(["zoo", str(models / "bad.onnx"), "--out", str(tmp_path), "--executor", "dask",
                   "--scheduler", address])
    err = capsys.readouterr().err
    assert status == 2 and no_connection == []
    scheme = address.split("://")[0] if "://" in address else "tcp"       # Dask's default scheme
    assert err.splitlines() == [f"apsat: {address}: refusing plain {scheme}:// to a scheduler off this machine "
                                f"(anyone who reaches its port can run code on the cluster): use tls:// with "
                                f"--security FILE, or --insecure on a network you trust"]
    with pytest.raises(ApsatError, match="refusing plain"):
        run_dask([Task("bad", str(models / "bad.onnx"), out=str(tmp_path))], address)
    assert no_connection == []


def test_insecure_lets_plain_tcp_through(models, tmp_path, capsys, no_connection):
    status = main(["zoo", str(models / "bad.onnx"), "--out", str(tmp_path), "--executor", "dask",
                   "--scheduler", OFF_MACHINE, "--insecure"])
    assert status == 2 and no_connection == [OFF_MACHINE]
    assert capsys.readouterr().err.strip() == (f"apsat: cannot reach the Dask scheduler at {OFF_MACHINE}: "
                                               f"OSError: no connection in this test")


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "tcp://127.3.2.1:8786", "tcp://localhost:8786",
                                     "tcp://[::1]:8786", "127.0.0.1:8786", "inproc://127.0.0.1/1/1"])
def test_plain_tcp_on_loopback_is_allowed(address):
    assert check_scheduler(address) is None


def test_tls_needs_credentials_and_tcp_takes_none(tls, tmp_path):
    _, sec = tls
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}), \
            pytest.raises(ApsatError, match=r"^tls://10\.255\.255\.1:8786: tls:// needs TLS credentials: "
                                            r"--security FILE, or Dask's distributed\.comm\.tls settings"):
        check_scheduler("tls://10.255.255.1:8786")
    assert check_scheduler("tls://10.255.255.1:8786", sec) is sec
    with pytest.raises(ApsatError, match="TLS credentials given for a plain tcp:// address: write tls://"):
        check_scheduler("tcp://127.0.0.1:8786", sec)
    with pytest.raises(ApsatError, match=r"unsupported scheme ucx://"):
        check_scheduler("ucx://127.0.0.1:8786")


def test_dask_config_credentials_serve_tls(tls, tmp_path):
    _, sec = tls
    _security_file(sec, tmp_path)
    with dask.config.set({"distributed.comm.tls.ca-file": str(tmp_path / "ca.pem"),
                          "distributed.comm.tls.client.cert": str(tmp_path / "cert.pem"),
                          "distributed.comm.tls.client.key": str(tmp_path / "key.pem")}):
        found = check_scheduler("tls://10.255.255.1:8786")
    assert found.tls_client_cert == str(tmp_path / "cert.pem")


def test_a_security_file_names_existing_files(tls, tmp_path, capsys):
    _, sec = tls
    loaded = load_security(_security_file(sec, tmp_path))
    assert loaded.require_encryption and loaded.tls_ca_file == str(tmp_path / "ca.pem")
    assert loaded.tls_client_key == str(tmp_path / "key.pem")
    bad = tmp_path / "bad.yaml"
    for text, why in [("ca_file: [unclosed", "not a YAML or JSON security file"),
                      ("- ca.pem\n", "a security file maps ca_file, cert and key to file paths"),
                      ('{"ca_file": "ca.pem", "cert": "cert.pem", "keyfile": "k"}', "unknown key(s) keyfile"),
                      ("ca_file: ca.pem\n", "ca_file and cert are required"),
                      ("ca_file: ca.pem\ncert: nowhere.pem\n", f"no such file: cert {tmp_path / 'nowhere.pem'}")]:
        bad.write_text(text)
        with pytest.raises(ApsatError, match="^" + str(bad).replace(".", r"\.")) as e:
            load_security(bad)
        assert why in str(e.value) and "\n" not in str(e.value)
    status = main(["zoo", str(tmp_path / "none.onnx"), "--executor", "dask", "--scheduler", "tls://127.0.0.1:1",
                   "--security", str(tmp_path / "missing.yaml"), "--out", str(tmp_path)])
    assert status == 2
    assert capsys.readouterr().err.strip() == (f"apsat: {tmp_path / 'missing.yaml'}: cannot read the security "
                                               f"file (No such file or directory)")
