"""The security section of docs/operations.md, for real: the documented ACL rule, exactly as
written, runs a worker, producers, the scheduler and every ``tether`` command; TLS with a CA
and client certificates made here; passwords that need percent-encoding, and URLs that
forgot it, never shown in messages or logs."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from tether import ConfigError, TaskFailed, Tether
from tether.base._embedded import EmbeddedServer, free_port
from tether.base._redis import parse_url, redact

from ..helpers import FAST, ROOT, ServerInfo, wait_until

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py

TETHER = str(Path(sys.executable).parent / "tether")
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
OPERATIONS = ROOT / "docs" / "operations.md"


def documented_acl_rule() -> list[str]:
    """The words of the ``<!-- acl-rule -->`` block of docs/operations.md."""
    match = re.search(r"<!-- acl-rule -->\n```text\n(.*?)```", OPERATIONS.read_text(), re.S)
    assert match, "docs/operations.md has no acl-rule block"
    words = match.group(1).split()
    assert words[:3] == ["ACL", "SETUSER", "tether"], words[:3]
    return words


def test_every_command_a_script_runs_is_in_the_documented_acl_rule() -> None:
    """Redis checks the commands a script runs against the user's rule: a script that starts
    using a command the rule leaves out fails for every user who followed the docs (a limit
    change once used ZREVRANGEBYSCORE). The behaviour test below runs most paths; this one
    reads every script."""
    allowed = {w[1:].lower() for w in documented_acl_rule() if w.startswith("+")}
    called = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
    wrapped = re.compile(r"pcall\(redis\.call,\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
    refused = set()
    for script in (ROOT / "src" / "tether" / "protocol" / "scripts").glob("*.lua"):
        text = script.read_text()
        for name, sub in called.findall(text) + wrapped.findall(text):
            command = name.lower()
            if command in allowed or f"{command}|{sub.lower()}" in allowed:
                continue
            refused.add(f"{script.name}: {name} {sub}".strip())
    assert not refused, sorted(refused)


def tether(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run(
        [TETHER, *args],
        env={**clean, "PYTHONPATH": PYTHONPATH, **env},
        capture_output=True, text=True, cwd=ROOT, timeout=90,
    )  # fmt: skip


def start_worker(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = [TETHER, "worker", "tests.apps.acl_app:app"]
    for key, value in FAST.items():
        args += ["--" + key.replace("_", "-"), str(value)]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [*args, *extra],
            env={**clean, "PYTHONPATH": PYTHONPATH, **env},
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(10)


# -- the ACL rule ------------------------------------------------------------------------


@pytest.fixture
def master_and_replica(server: ServerInfo) -> Iterator[EmbeddedServer]:
    """A server of the session's kind with one replica, so that enqueue_replicas=1 has one to
    wait for; the ACL user lives on the master."""
    master = EmbeddedServer(server.process.binary, args=["--repl-diskless-sync-delay", "0"]).start()
    replica = EmbeddedServer(
        server.process.binary, args=["--replicaof", "127.0.0.1", str(master.port)]
    ).start()
    try:
        probe = redis.Redis.from_url(replica.url)
        wait_until(lambda: probe.info("replication").get("master_link_status") == "up", 20)
        probe.close()
        yield master
    finally:
        replica.cleanup()
        master.cleanup()


def test_the_documented_acl_rule_runs_everything(
    master_and_replica: EmbeddedServer, tmp_path: Path
) -> None:
    """Two workers with one slot each (so they also wait without taking, and see each other's
    entries), producers waiting for a replica, the scheduler, tasks held back by rate and
    concurrency limits (task-wide and per key), every read of the management API and its
    writes, every command, a shutdown that hands a running task to the other worker, and the
    removal of the stopped one. A command the rule does not allow fails this test."""
    words = documented_acl_rule()
    namespace = next(w for w in words if w.startswith("~{"))[2:].rstrip(":*")
    password = next(w for w in words if w.startswith(">"))[1:]
    admin = redis.Redis.from_url(master_and_replica.url)
    admin.execute_command(*words)
    admin.acl_log_reset()
    url = f"redis://tether:{quote(password, safe='')}@127.0.0.1:{master_and_replica.port}/0"
    env = {"TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    stream = f"{{{namespace}:default}}:stream:normal"
    options = ["--concurrency", "1", "--housekeeping-interval", "0.5", "--shutdown-grace", "0.2"]
    logs = {name: tmp_path / f"{name}.log" for name in ("acl-a", "acl-b")}
    workers = {name: start_worker(env, log, "--name", name, *options) for name, log in logs.items()}
    try:
        for name in workers:
            wait_until(lambda n=name: admin.exists(f"{{{namespace}:default}}:lease:{n}"), 20)
        ids = asyncio.run(_produce(url, namespace))
        _use_the_management_api(url, namespace, ids)
        _use_every_command(env, ids, "acl-a")
        from tests.apps import acl_app

        acl_app.app.configure(url=url, namespace=namespace)
        try:
            lingering = acl_app.linger.enqueue_sync(3.0)  # outlasts the grace, even under load
            entry = lingering.id.rpartition(":")[2].partition("-")[2]

            def runner() -> str:
                pending = admin.xpending_range(stream, "tether", entry, entry, 1)
                return pending[0]["consumer"].decode() if pending else ""

            first = wait_until(runner, 20)
            # Pending is not started: a worker stopped between the server's delivery and the
            # start hands the entry off as fetched while stopping, not as still running.
            wait_until(lambda: admin.exists(acl_app.started_key(lingering.id)), 20)
            assert stop(workers[first]) == 0, logs[first].read_text()
            assert lingering.result_sync(timeout=20) == "done"
        finally:
            acl_app.app.close_sync()
        other = next(n for n in workers if n != first)
        wait_until(lambda: first not in str(admin.xinfo_consumers(stream, "tether")), 20)
        assert stop(workers[other]) == 0, logs[other].read_text()
    finally:
        for proc in workers.values():
            stop(proc)
    handed = logs[first].read_text()
    assert "handed off 1 entry (still running when the shutdown grace ended)" in handed, handed
    assert "from abandoned" in logs[other].read_text()
    for log in logs.values():
        text = log.read_text()
        assert "ERROR" not in text and "no permissions" not in text, text
    refused = [entry for entry in admin.acl_log() if entry.get("username") == "tether"]
    # Left out on purpose, as the docs say: CONFIG GET (workers then skip the eviction
    # check) and CLIENT SETINFO (redis-py carries on without it).
    optional = {"config|get", "client|setinfo"}
    assert [e for e in refused if e.get("object") not in optional] == [], refused
    admin.close()


async def _produce(url: str, namespace: str) -> dict[str, str]:
    """Every producer call, with a replica to wait for: enqueue (plain, delayed, deduplicated,
    batched, by name, limited), results, status, cancel, a failure, runtime schedules."""
    app = Tether(url, namespace=namespace, enqueue_replicas=1, enqueue_replicas_timeout=5)
    from tests.apps import acl_app

    async with app:
        plain = await app.enqueue_by_name("tests.apps.acl_app.work", 1)
        later = await app.by_name("tests.apps.acl_app.work").options(delay=0.2).enqueue(2)
        keyed = await app.by_name("tests.apps.acl_app.work").options(key="k").enqueue(3)
        batch = await app.by_name("tests.apps.acl_app.work").enqueue_many([(4,), (5,)])
        failing = await app.enqueue_by_name("tests.apps.acl_app.work", -1)
        cancelled = await app.by_name("tests.apps.acl_app.work").options(delay=60).enqueue(6)
        limited = [
            await app.by_name("tests.apps.acl_app.limited").options(limit_key=key).enqueue(n)
            for n, key in enumerate(["k1", "k1", "k1", "k2", "k2", "k3"])
        ]
        assert await cancelled.cancel()
        assert [await h.result(timeout=30) for h in limited] == list(range(6))
        assert [await h.result(timeout=20) for h in (plain, later, keyed, *batch)] == [
            2, 4, 6, 8, 10
        ]  # fmt: skip
        with pytest.raises(TaskFailed):
            await failing.result(timeout=20)
        assert (await plain.status()).value == "succeeded"
    declared = acl_app.app  # runtime schedules need the task's declaration
    declared.configure(url=url, namespace=namespace)
    async with declared:
        control = declared.schedules
        await control.add(acl_app.beat, every=60, name="extra")
        await control.pause("extra")
        await control.resume("extra")
        fired = await control.trigger("extra")
        await fired.result(timeout=20)
        assert await control.remove("extra")
        assert await control.leader()
    return {"ok": plain.id, "failed": failing.id, "queued": cancelled.id}


def _use_the_management_api(url: str, namespace: str, ids: dict[str, str]) -> None:
    """Every read of the management API (the same readers as the dashboard's pages and
    ``app.stats``), and writes that run scripts of their own: pause and resume, a limit
    changed and reset, a dead letter retried."""
    import httpx

    from tests.apps import acl_app
    from tether.web import create_app

    from ..integration.test_web import routes_of
    from ..web_helpers import TOKEN, serving

    async def delay(cancel: list[str]) -> list[str]:
        """Two tasks waiting for their time, for the list of them to page through."""
        async with Tether(url, namespace=namespace) as app:
            for task_id in cancel:
                assert await app.handle(task_id).cancel()
            task = app.by_name("tests.apps.acl_app.work").options(delay=120)
            return [] if cancel else [(await task.enqueue(n)).id for n in (7, 8)]

    waiting = asyncio.run(delay([]))
    acl_app.app.configure(url=url, namespace=namespace)
    web = create_app(acl_app.app, token=TOKEN)
    limits = "/api/queues/default/limits/tests.apps.acl_app.limited"
    with (
        serving(web) as base,
        httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as http,
    ):

        def ok(method: str, path: str, **kwargs: Any) -> Any:
            answer = http.request(method, path, **kwargs)
            assert answer.status_code == 200, (method, path, answer.status_code, answer.text)
            return answer.json()

        (letter,) = ok("GET", "/api/queues/default/dead")["items"]
        values = {
            "queue": "default", "task_id": ids["ok"], "entry_id": letter["entry_id"],
            "name": "beat", "task": "tests.apps.acl_app.limited", "key": "k1",
        }  # fmt: skip
        reads = [p for m, p in routes_of(web) if m == "GET" and p.startswith("/api/")]
        assert "/api/stats/tasks" in reads and "/api/queues" in reads, reads
        for route in reads:
            path = route.replace("/workers/{name}", "/workers/acl-a")
            for name, value in values.items():
                path = path.replace("{" + name + "}", value).replace("{" + name + ":path}", value)
            ok("GET", path)
        ok("GET", "/api/queues/default/throughput", params={"minutes": 1440})
        ok("GET", "/api/stats/tasks", params={"window": 24 * 3600})
        ok("GET", "/api/tasks/" + ids["failed"])
        page = ok("GET", "/api/queues/default/delayed", params={"limit": 1})
        assert page["cursor"], page
        ok("GET", "/api/queues/default/delayed", params={"cursor": page["cursor"]})
        ok("POST", "/api/queues/default/pause")
        ok("POST", "/api/queues/default/resume")
        ok("PATCH", limits, json={"rate_limit": "30/s", "concurrency_limit": 2})
        ok("DELETE", limits)
        ok("POST", f"/api/queues/default/dead/{letter['entry_id']}/retry")
        # It fails again and comes back, for the commands to find it.
        wait_until(lambda: ok("GET", "/api/queues/default/dead")["items"], 20)
    asyncio.run(delay(waiting))


def _use_every_command(env: dict[str, str], ids: dict[str, str], worker: str) -> None:
    app = ["--app", "tests.apps.acl_app:app"]
    for args in (
        ["info", *app],
        ["info", "--json", *app],
        ["dead", "list", *app],
        ["dead", "show", ids["failed"], *app],
        ["task", "status", ids["ok"], *app],
        ["task", "result", ids["ok"], *app],
        ["task", "cancel", ids["ok"], *app],
        ["schedules", "tests.apps.acl_app:app"],
        ["check", "--name", worker, *app],
        ["dead", "retry", ids["failed"], *app],
    ):
        done = tether(*args, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    # The retried task fails again (it is negative) and comes back; purge it.
    wait_until(lambda: '"task_id"' in tether("dead", "list", "--json", *app, env=env).stdout, 20)
    purged = tether("dead", "purge", ids["failed"], *app, env=env)
    assert purged.returncode == 0, purged.stderr


@pytest.mark.parametrize(
    "command",
    [
        "hscan",  # sent by the worker's flow control (a task with a concurrency limit)
        "zrangebyscore",  # inside the promote script, where Redis 7.0 does not name it
        "xack",  # inside the settle script (the periodic task "beat" runs every 0.5 s)
    ],
)
def test_a_permission_taken_away_mid_run_stops_the_worker_with_one_line(
    server: ServerInfo, tmp_path: Path, command: str
) -> None:
    """As at start-up: one line naming the command refused and the permission to add, exit
    status 1; it used to end in "unexpected error from Redis" and a traceback."""
    own = EmbeddedServer(server.process.binary).start()
    admin = redis.Redis.from_url(own.url)
    try:
        words = documented_acl_rule()
        admin.execute_command(*words)
        namespace = next(w for w in words if w.startswith("~{"))[2:].rstrip(":*")
        password = next(w for w in words if w.startswith(">"))[1:]
        where = f"redis://tether:***@127.0.0.1:{own.port}/0"
        url = where.replace("***", quote(password, safe=""))
        log = tmp_path / "worker.log"
        worker = start_worker({"TETHER_URL": url, "TETHER_NAMESPACE": namespace}, log)
        try:
            wait_until(lambda: "serving queues default" in log.read_text(), 20)
            time.sleep(0.5)  # a few maintenance passes with every permission
            admin.execute_command("ACL", "SETUSER", "tether", f"-{command}")
            assert worker.wait(30) == 1, log.read_text()
        finally:
            stop(worker)
        text = log.read_text()
        last = text.splitlines()[-1]
        assert last.startswith(f"Error: the user lacks a permission at {where}: "), text
        assert last.endswith(f"; allow it with +{command} in the user's ACL rule"), text
        assert "Traceback" not in text and "unexpected error" not in text, text
    finally:
        admin.close()
        own.cleanup()


# -- TLS ---------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate."""
    assert shutil.which("openssl"), "openssl is needed (Debian's openssl package)"
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=Tether test CA", cwd=d)  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, extra in (("server", ["-extfile", "san.cnf"]), ("client", [])):
        _openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)  # fmt: skip
    return d


def test_a_worker_and_a_producer_over_tls_with_client_certificates(
    certificates: Path, tmp_path: Path, namespace: str
) -> None:
    d = certificates
    port, proc = _start_tls_server(d)
    try:
        query = f"ssl_ca_certs={d}/ca.pem&ssl_certfile={d}/client.pem&ssl_keyfile={d}/client.key"
        url = f"rediss://localhost:{port}/0?{query}&ssl_cert_reqs=required"
        env = {"TETHER_URL": url, "TETHER_NAMESPACE": namespace}
        log = tmp_path / "tls-worker.log"
        worker = start_worker(env, log)
        try:
            app = Tether(url, namespace=namespace)

            async def produce() -> int:
                async with app:
                    return int(await app.handle(
                        (await app.enqueue_by_name("tests.apps.acl_app.work", 21)).id
                    ).result(timeout=20))  # fmt: skip

            assert asyncio.run(produce()) == 42
            listed = tether("dead", "list", "--json", env=env)
            assert listed.returncode == 0, listed.stderr
        finally:
            assert stop(worker) == 0, log.read_text()
        assert "serving queues default" in log.read_text()
        # A certificate the client cannot check, and a file that is not there, stop the
        # worker at start-up with a message instead of retrying forever.
        keys = f"ssl_certfile={d}/client.pem&ssl_keyfile={d}/client.key"
        refused = tether("worker", "tests.apps.acl_app:app",
                         "--url", f"rediss://localhost:{port}/0?{keys}", env={})  # fmt: skip
        assert refused.returncode == 1
        assert "the TLS certificate of the server at rediss://localhost:" in refused.stderr
        assert "name the authority that signed it with ssl_ca_certs=" in refused.stderr
        missing = tether("worker", "tests.apps.acl_app:app",
                         "--url", f"rediss://localhost:{port}/0?ssl_ca_certs={d}/nope.pem",
                         env={})  # fmt: skip
        assert missing.returncode == 1
        assert f"no such file: ssl_ca_certs={d}/nope.pem" in missing.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def _start_tls_server(d: Path) -> tuple[int, subprocess.Popen[bytes]]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is needed for the TLS test (Debian's redis-server package)"
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "-::1",
         "--save", "", "--appendonly", "no",
         "--tls-cert-file", str(d / "server.pem"), "--tls-key-file", str(d / "server.key"),
         "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "yes",
         "--dir", str(d)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(
        host="localhost", port=port, ssl=True, ssl_ca_certs=str(d / "ca.pem"),
        ssl_certfile=str(d / "client.pem"), ssl_keyfile=str(d / "client.key"),
    )  # fmt: skip

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_until(answers, 20)
    client.close()
    return port, proc


# -- passwords in the URL ----------------------------------------------------------------

SECRET = "Zq7k@Kx9w#Wv3j/Jm8p?Pn2r:Rb5t%Ty6u"


@pytest.fixture
def locked(server: ServerInfo) -> Iterator[EmbeddedServer]:
    proc = EmbeddedServer(server.process.binary, args=["--requirepass", SECRET]).start()
    yield proc
    proc.cleanup()


def _fragments(secret: str) -> list[str]:
    """Every piece of the secret a parser might have split off at a delimiter."""
    pieces = re.split(r"[@#/?:%]", secret)
    return [p for p in pieces if len(p) >= 3]


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@localhost:6379/0",
        f"redis://user:{SECRET}@localhost:6379/0",
        f"redis+cluster://:{SECRET}@a:7000,b:7001",
        f"redis+sentinel://:{SECRET}@s1:26379/mymaster",
        f"redis://:{SECRET}@localhost:notaport/0",
        f"{SECRET}@localhost",
    ],
)
def test_an_unencoded_password_is_refused_and_never_shown(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_url(url)
    message = str(refused.value)
    for piece in _fragments(SECRET):
        assert piece not in message, (piece, message)
    assert "percent-encode" in message or "expected a URL" in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cr@t#x@localhost:1/0", "redis://:***@localhost:1/0"),
        ("redis://me:a/b@host/0", "redis://me:***@host/0"),
        ("redis://secret@host/0", "redis://***@host/0"),
        (
            "redis+sentinel://:pw@s1:26379/mymaster?sentinel_password=sp&sentinel_username=u",
            "redis+sentinel://:***@s1:26379/mymaster?sentinel_password=***&sentinel_username=u",
        ),
        ("unix://u:pw@/tmp/r.sock?db=1&password=pw", "unix://u:***@/tmp/r.sock?db=1&password=***"),
    ],
)
def test_redaction_hides_whatever_the_parser_could_not_parse(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_a_percent_encoded_password_works_and_stays_hidden(
    locked: EmbeddedServer, namespace: str, tmp_path: Path
) -> None:
    url = f"redis://:{quote(SECRET, safe='')}@127.0.0.1:{locked.port}/0"
    assert parse_url(url).password == SECRET
    env = {"TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    log = tmp_path / "worker.log"
    worker = start_worker(env, log, "--burst")
    assert worker.wait(60) == 0, log.read_text()
    text = log.read_text()
    assert f"on redis://:***@127.0.0.1:{locked.port}/0" in text
    unencoded = tether("dead", "list", "--url", f"redis://:{SECRET}@127.0.0.1:{locked.port}/0",
                       env={})  # fmt: skip
    assert unencoded.returncode == 2
    out = text + unencoded.stdout + unencoded.stderr
    for piece in [*_fragments(SECRET), quote(SECRET, safe="")]:
        assert piece not in out, piece
    listed = tether("dead", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert json.loads("[" + ",".join(listed.stdout.splitlines()) + "]") == []
