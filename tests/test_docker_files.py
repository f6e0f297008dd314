"""The docker/ files, checked as far as they can be without Docker.

Every NATS configuration passes ``nats-server -t``; compose.yaml parses and
refers only to files that exist, also as the containers see them through
their mounts; the CONVMEM_* variables in the compose file and the Dockerfile
are exactly the ones the CLI reads (`ENVIRONMENT`) and give the values they
say; the image runs as a non-root user with a health check that is a valid
`convmem` command.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import nats
import pytest
import yaml
from cluster import COMPOSE, DOCKER, NODES

import convmem
from convmem.adapters import EmbeddedNatsServer, MemoryService, RemoteSession
from convmem.adapters.backends.jetstream._connection import MIN_SERVER_VERSION
from convmem.adapters.backends.jetstream._embedded import find_nats_server
from convmem.adapters.frontends.cli._main import build_parser
from convmem.adapters.frontends.cli._serve import ENVIRONMENT, apply_serve_environment, load_config
from convmem.events import ConversationTurn, MemoryKey

DOCKERFILE = DOCKER / "Dockerfile"
CONFIGS = sorted(DOCKER.rglob("*.conf"))
CONVMEM_SERVICES = ("convmem-1", "convmem-2")
_INCLUDE = re.compile(r"^\s*include\s+\"?([^\"\s;]+)\"?", re.MULTILINE)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    out = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def instructions(name: str) -> list[str]:
    return [args for instruction, args in dockerfile() if instruction == name]


def includes(config: Path) -> list[str]:
    return _INCLUDE.findall(config.read_text(encoding="utf-8"))


# NATS configurations ------------------------------------------------------------------------


def test_there_is_a_configuration_per_cluster_node_and_they_include_the_shared_ones() -> None:
    """n1..n3 exist, differ only in server_name, and include the tenants and cluster files."""
    texts = {node: (DOCKER / "nats-cluster" / f"{node}.conf").read_text(encoding="utf-8") for node in NODES}
    for node, text in texts.items():
        assert re.search(rf"^server_name: {node}$", text, re.MULTILINE), node
        assert includes(DOCKER / "nats-cluster" / f"{node}.conf") == ["../nats-tenants.conf", "cluster.conf"]
    same = {re.sub(r"(?<=\bn)\d|(?<=\bnats-)\d", "K", text) for text in texts.values()}
    assert len(same) == 1, "the node files differ in more than their number"


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c.relative_to(DOCKER)) for c in CONFIGS])
def test_every_nats_configuration_passes_nats_server_t(config: Path, tmp_path: Path) -> None:
    """`nats-server -c FILE -t` accepts each file, run from a copy of docker/ so includes resolve alike."""
    copy = tmp_path / "docker"
    shutil.copytree(DOCKER, copy)
    target = copy / config.relative_to(DOCKER)
    done = subprocess.run(
        [str(find_nats_server()), "-c", str(target), "-t"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is valid" in done.stdout + done.stderr


def test_every_include_names_a_file_that_exists() -> None:
    """Includes are relative to the including file, as nats-server reads them."""
    for config in CONFIGS:
        for name in includes(config):
            assert (config.parent / name).is_file(), f"{config}: include {name} is missing"


def test_the_single_server_configuration_fsyncs_every_write() -> None:
    """The base of every node acknowledges only what is on disk (sync_interval: always)."""
    text = (DOCKER / "nats-tenants.conf").read_text(encoding="utf-8")
    assert re.search(r"^\s*sync_interval: always$", text, re.MULTILINE)
    assert re.search(r'^\s*store_dir: "/data/jetstream"$', text, re.MULTILINE)


# compose.yaml ---------------------------------------------------------------------------------


def test_compose_has_three_nats_nodes_and_two_convmem_services() -> None:
    """Three nodes on persistent named volumes, two serve replicas that wait for healthy nodes."""
    services = compose()["services"]
    assert set(services) == {"nats-1", "nats-2", "nats-3", *CONVMEM_SERVICES}
    volumes = compose()["volumes"]
    for n in (1, 2, 3):
        node = services[f"nats-{n}"]
        assert node["command"] == ["nats-server", "-c", f"/etc/nats/nats-cluster/n{n}.conf"]
        assert f"nats-{n}-data:/data" in node["volumes"]
        assert f"nats-{n}-data" in volumes
        image, _, tag = node["image"].partition(":")
        assert image == "nats"
        major, minor = (int(x) for x in re.findall(r"\d+", tag)[:2])
        assert (major, minor) >= MIN_SERVER_VERSION
    for name in CONVMEM_SERVICES:
        service = services[name]
        assert set(service["depends_on"]) == {"nats-1", "nats-2", "nats-3"}
        assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())


def test_compose_references_only_files_that_exist() -> None:
    """The build context, its Dockerfile and every bind-mounted file or folder are there."""
    for name, service in compose()["services"].items():
        build = service.get("build")
        if build is not None:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context.is_dir(), name
            assert (context / build["dockerfile"]).resolve() == DOCKERFILE
        for volume in service.get("volumes", ()):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} is missing"


def _host_path(service: dict[str, Any], inside: PurePosixPath) -> Path | None:
    """The file of the repository that a container sees at `inside`, through its bind mounts."""
    volumes: list[str] = service.get("volumes", [])
    for volume in volumes:
        source, target = volume.split(":")[:2]
        if not source.startswith("."):
            continue
        target_path = PurePosixPath(target)
        if inside == target_path or target_path in inside.parents:
            return (COMPOSE.parent / source / inside.relative_to(target_path)).resolve()
    return None


def test_each_node_sees_its_configuration_and_includes_through_its_mounts() -> None:
    """Inside a container, `-c` and every include reach the repository's files."""
    for n in (1, 2, 3):
        service = compose()["services"][f"nats-{n}"]
        config = PurePosixPath(service["command"][-1])
        seen = [config]
        while seen:
            inside = seen.pop()
            host = _host_path(service, inside)
            assert host is not None, f"nats-{n}: {inside} is not mounted"
            assert host.is_file(), f"nats-{n}: {inside} is mounted from {host}, which is missing"
            seen += [PurePosixPath(posixpath.normpath(inside.parent / name)) for name in includes(host)]


def test_the_node_health_check_asks_the_configured_monitoring_port() -> None:
    """compose's health check uses the http port of nats-tenants.conf."""
    text = (DOCKER / "nats-tenants.conf").read_text(encoding="utf-8")
    port = re.search(r'^http: "0\.0\.0\.0:(\d+)"$', text, re.MULTILINE)
    assert port is not None
    for n in (1, 2, 3):
        test = compose()["services"][f"nats-{n}"]["healthcheck"]["test"]
        assert f"http://127.0.0.1:{port.group(1)}/healthz" in test


# Environment variables ------------------------------------------------------------------------


def test_compose_sets_only_variables_the_cli_reads() -> None:
    """Every variable of a convmem service is a name in ENVIRONMENT."""
    for name in CONVMEM_SERVICES:
        env = environment(compose()["services"][name])
        assert env, name
        assert set(env) <= set(ENVIRONMENT), set(env) - set(ENVIRONMENT)


def test_the_dockerfile_sets_only_variables_the_cli_reads() -> None:
    """The CONVMEM_* names of ENV lines are names in ENVIRONMENT."""
    names = {m for args in instructions("ENV") for m in re.findall(r"\b(CONVMEM_[A-Z_]+)=", args)}
    assert names
    assert names <= set(ENVIRONMENT), names - set(ENVIRONMENT)


def test_every_convmem_variable_named_under_docker_is_real() -> None:
    """No file under docker/ (README included) names a CONVMEM_* variable the code does not read."""
    for path in DOCKER.rglob("*"):
        if path.is_file():
            names = set(re.findall(r"(?<![.\w$])CONVMEM_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
            assert names <= set(ENVIRONMENT), f"{path}: {names - set(ENVIRONMENT)}"


def test_every_environment_name_is_read_by_the_cli() -> None:
    """ENVIRONMENT lists what the CLI reads: each name appears in the CLI's sources."""
    sources = "".join(
        (Path(__file__).resolve().parent.parent / "convmem" / "adapters" / "frontends" / "cli" / f).read_text(
            encoding="utf-8"
        )
        for f in ("_main.py", "_serve.py")
    )
    code = sources.replace("ENVIRONMENT = {", "", 1)
    for name in ENVIRONMENT:
        assert code.count(f'"{name}"') >= 2, f"{name} is listed but never read"


def _flag(name: str) -> str:
    match = re.match(r"(--[a-z-]+):", ENVIRONMENT[name])
    assert match, name
    return match.group(1)[2:].replace("-", "_")


@pytest.mark.parametrize("service", CONVMEM_SERVICES)
def test_the_compose_environment_configures_serve_as_it_says(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`convmem serve` under compose's environment parses to exactly the values compose gives."""
    env = environment(compose()["services"][service])
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = apply_serve_environment(build_parser().parse_args(["serve"]))
    for name, value in env.items():
        assert str(getattr(args, _flag(name))) == value, name
    assert args.replicas == 3
    assert len(args.nats.split(",")) == 3


# Dockerfile -----------------------------------------------------------------------------------


def test_the_image_is_a_small_multi_stage_build() -> None:
    """Wheels are built in a first stage; the runtime is python:3.11-slim."""
    stages = instructions("FROM")
    assert len(stages) == 2
    assert stages[0].startswith("python:3.11-slim AS ")
    assert stages[1] == "python:3.11-slim"


def test_the_image_copies_only_files_that_exist_and_are_not_ignored() -> None:
    """Each COPY source (context: the repository root) exists and the Dockerfile's ignore file keeps it."""
    root = DOCKER.parent
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = [s for args in instructions("COPY") if not args.startswith("--from") for s in args.split()[:-1]]
    assert sources
    for source in sources:
        assert (root / source).exists(), source
        assert source.rstrip("/") in kept, f"{source} is excluded from the build context"


def test_the_image_runs_as_a_non_root_user() -> None:
    """The last USER is neither root nor uid 0."""
    users = instructions("USER")
    assert users
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_the_image_has_a_health_check_that_is_a_valid_convmem_command() -> None:
    """HEALTHCHECK runs `convmem status`, which the CLI parses."""
    checks = instructions("HEALTHCHECK")
    assert len(checks) == 1
    options, _, command = checks[0].partition("CMD ")
    assert "--interval=" in options
    argv = json.loads(command)
    assert argv[0] == "convmem"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "status"


def test_the_image_runs_convmem_serve_by_default() -> None:
    """ENTRYPOINT convmem, CMD serve: flags after the image name reach the CLI."""
    assert [json.loads(a) for a in instructions("ENTRYPOINT")] == [["convmem"]]
    assert [json.loads(a) for a in instructions("CMD")] == [["serve"]]


def test_the_compose_configuration_makes_the_readmes_context_request_return_turns(
    nats_server: EmbeddedNatsServer,
) -> None:
    """serve with compose's CONVMEM_CONFIG answers the README's `nats req ... context` with the turn."""
    mounted = compose()["services"]["convmem-1"]["environment"]["CONVMEM_CONFIG"]
    [source] = [
        volume.split(":")[0]
        for volume in compose()["services"]["convmem-1"]["volumes"]
        if volume.split(":")[1] == mounted
    ]
    config = load_config(DOCKER / source)
    with convmem.connect(nats_server.url, config=config) as memory, MemoryService(memory, nats_server.url):
        with RemoteSession(nats_server.url, MemoryKey("acme", "alice@example.com", "chat-1")) as session:
            session.add_turn(ConversationTurn(user_message="Hi, I'm Alice.", assistant_response="Hello!"))

        async def nats_req() -> (
            Any
        ):  # `nats --inbox-prefix _INBOX_acme req convmem.api.v1.acme.context '{...}'`
            client = await nats.connect(nats_server.url, inbox_prefix="_INBOX_acme")
            try:
                payload = b'{"user_id": "alice@example.com", "session_id": "chat-1"}'
                reply = await client.request("convmem.api.v1.acme.context", payload, timeout=10)
                return json.loads(reply.data)
            finally:
                await client.close()

        reply = asyncio.run(nats_req())
    assert reply["ok"] is True
    assert reply["result"]["conversation_memory"]["recent_turns"][0]["user"] == "Hi, I'm Alice."
