"""The prefix store's shared tier over TLS on a real redis-server: server processes that verify the
store's certificate and present their own (mutual TLS, with a password) resume a conversation one
another wrote; a server that does not trust the store's certificate, or has none to present, answers
from scratch and counts the failure; the URL's own `ssl_*` parameters still work; TLS options that
cannot work are refused at start."""

from __future__ import annotations

import argparse
from pathlib import Path

import certs
import numpy as np
import pytest
from fixtures import make_models
from redis_process import RedisServer, TlsFiles, redis_server_binary, running_redis
from server_process import free_port, running_server
from test_server_hybrid import generate, reference
from test_shared_tier import PROMPT, metric, wait_until

from hyserve.api.shared_cache_args import add_shared_cache_arguments, shared_cache_config
from hyserve.engine.store_tiers.shared import SharedTier, SharedTierConfig
from hyserve_client import ReuseSource, StoreTier

PASSWORD = "s3cret-over-tls"

if redis_server_binary() is None:
    pytest.skip("redis-server not installed (bash .ci/install.sh --test installs it)", allow_module_level=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_model(tmp_path_factory.mktemp("shared-tls") / "qwen35.gguf", "qwen35", qtype="q8_0")


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    """A CA, the store's certificate for 127.0.0.1 and a client certificate, all signed by it."""
    (tmp_path / "pki").mkdir()
    ca = certs.TestCA(tmp_path / "pki")
    return TlsFiles(ca.pair.cert, ca.issue("redis-server", server=True), ca.issue("hyserve", server=False))


@pytest.fixture
def stranger(tmp_path: Path) -> Path:
    """A self-signed CA certificate that signed nothing the store presents."""
    (tmp_path / "stranger").mkdir()
    return certs.TestCA(tmp_path / "stranger", cn="another CA").pair.cert


def serve_args(model_path: Path, tmp_path: Path, store: RedisServer, metrics: int, *tls_options: str) -> list[str]:
    password_file = tmp_path / "redis-password"
    password_file.write_text(PASSWORD + "\n")
    args = ["--model", str(model_path), "--ctx-size", "1024", "--threads", "2", "--prompt-chunk", "64"]
    args += ["--metrics-port", str(metrics), "--cache-redis", f"rediss://127.0.0.1:{store.port}/0"]
    return [*args, "--cache-redis-password-file", str(password_file), *tls_options]


def tls_options(ca: Path, files: TlsFiles | None) -> list[str]:
    """The CA that verifies the store, and the client certificate when `files` gives one."""
    options = ["--cache-redis-tls-ca-file", str(ca)]
    if files is not None:
        options += ["--cache-redis-tls-cert-file", str(files.client.cert)]
        options += ["--cache-redis-tls-key-file", str(files.client.key)]
    return options


def test_servers_resume_one_another_over_mutual_tls(model_path: Path, tmp_path: Path, tls: TlsFiles) -> None:
    with running_redis(tmp_path / "redis.log", password=PASSWORD, tls=tls) as store:
        metrics = free_port()
        args = serve_args(model_path, tmp_path, store, metrics, *tls_options(tls.ca, tls))
        with running_server(tmp_path / "writer.log", *args) as target:
            _, answer, _ = generate(target, PROMPT, 5)
            assert answer == reference(model_path, PROMPT, 5)
            wait_until("written", lambda: metric(metrics, "hyserve_store_tier_writes_total", "shared") >= 1)
            assert metric(metrics, "hyserve_store_tier_errors_total", "shared") == 0
        follow_up = PROMPT + answer + [int(t) for t in np.random.default_rng(12).integers(10, 400, size=40)]
        metrics = free_port()
        args = serve_args(model_path, tmp_path, store, metrics, *tls_options(tls.ca, tls))
        with running_server(tmp_path / "reader.log", *args) as target:
            accepted, tokens, finished = generate(target, follow_up, 5)
            held = len(PROMPT) + len(answer) - 1  # the writer's slot: prompt + completion less its last token
            assert accepted.reuse_source is ReuseSource.PREFIX_STORE and accepted.store_tier is StoreTier.SHARED
            assert accepted.reused_tokens == held
            assert finished.usage.processed_prompt_tokens == len(follow_up) - held
            assert tokens == reference(model_path, follow_up, 5)
            assert metric(metrics, "hyserve_store_tier_hits_total", "shared") == 1
            assert metric(metrics, "hyserve_store_tier_errors_total", "shared") == 0
        assert list(store.client().scan_iter("hyserve:*"))
    for log in ("writer.log", "reader.log"):
        assert PASSWORD not in (tmp_path / log).read_text()


@pytest.mark.parametrize("case", ["a CA that did not sign the store's certificate", "no client certificate"])
def test_a_server_the_store_handshake_fails_for_answers_from_scratch(
    model_path: Path, tmp_path: Path, tls: TlsFiles, stranger: Path, case: str
) -> None:
    options = tls_options(stranger, tls) if case.startswith("a CA") else tls_options(tls.ca, None)
    with running_redis(tmp_path / "redis.log", password=PASSWORD, tls=tls) as store:
        metrics = free_port()
        with running_server(
            tmp_path / "server.log", *serve_args(model_path, tmp_path, store, metrics, *options)
        ) as target:
            accepted, tokens, _ = generate(target, PROMPT, 5)
            assert accepted.reuse_source is ReuseSource.NONE and accepted.reused_tokens == 0
            assert tokens == reference(model_path, PROMPT, 5)
            wait_until("the failure counted", lambda: metric(metrics, "hyserve_store_tier_errors_total", "shared") >= 1)
            assert metric(metrics, "hyserve_store_tier_hits_total", "shared") == 0
            assert metric(metrics, "hyserve_store_tier_writes_total", "shared") == 0
        assert not list(store.client().scan_iter("hyserve:*"))
    assert "shared_cache_error" in (tmp_path / "server.log").read_text()


def test_the_urls_own_ssl_parameters_still_work_and_win(tmp_path: Path, tls: TlsFiles, stranger: Path) -> None:
    counts: dict[str, int] = {}

    def count_tier(tier: str, **deltas: int) -> None:
        for k, v in deltas.items():
            counts[k] = counts.get(k, 0) + v

    with running_redis(tmp_path / "redis.log", password=PASSWORD, tls=tls) as store:
        query = f"?ssl_ca_certs={tls.ca}&ssl_certfile={tls.client.cert}&ssl_keyfile={tls.client.key}"
        for config in (
            SharedTierConfig(store.url + query, PASSWORD),
            # the options name a CA that would fail: the URL's CA is the one used
            SharedTierConfig(
                store.url + f"?ssl_ca_certs={tls.ca}",
                PASSWORD,
                ca_file=str(stranger),
                cert_file=str(tls.client.cert),
                key_file=str(tls.client.key),
            ),
        ):
            tier = SharedTier(config, "tls-url-test", count_tier)
            try:
                tier.lookup([PROMPT])  # one round trip to an empty store: a plain miss
                assert tier.candidates() == [] and counts == {"misses": 1}
            finally:
                tier.close()
            counts.clear()


def _config(*argv: str) -> SharedTierConfig | None:
    parser = argparse.ArgumentParser()
    add_shared_cache_arguments(parser)
    return shared_cache_config(parser.parse_args(list(argv)))


def test_tls_options_map_to_the_config(tls: TlsFiles) -> None:
    files = ["--cache-redis-tls-ca-file", str(tls.ca), "--cache-redis-tls-cert-file", str(tls.client.cert)]
    config = _config(
        "--cache-redis", "rediss://store:6380/0", *files, "--cache-redis-tls-key-file", str(tls.client.key)
    )
    assert config is not None
    assert config.tls_arguments() == {
        "ssl_ca_certs": str(tls.ca),
        "ssl_certfile": str(tls.client.cert),
        "ssl_keyfile": str(tls.client.key),
    }
    plain = _config("--cache-redis", "rediss://store:6380/0")
    assert plain is not None and plain.tls_arguments() == {}
    # the same rules for a config made without the CLI
    with pytest.raises(ValueError, match="rediss://"):
        SharedTierConfig("redis://store:6379/0", ca_file=str(tls.ca)).tls_arguments()
    with pytest.raises(ValueError, match="its key"):
        SharedTierConfig("rediss://store:6380/0", cert_file=str(tls.client.cert)).tls_arguments()


TLS_URL = ["--cache-redis", "rediss://store:6380/0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cache-redis", "redis://store:6379/0", "--cache-redis-tls-ca-file", "{ca}"], "need a rediss://"),
        (["--cache-redis-tls-ca-file", "{ca}"], "need a rediss://"),
        (["--cache-redis", "unix:///run/redis.sock", "--cache-redis-tls-cert-file", "{cert}"], "need a rediss://"),
        ([*TLS_URL, "--cache-redis-tls-cert-file", "{cert}"], "go together"),
        ([*TLS_URL, "--cache-redis-tls-key-file", "{key}"], "go together"),
        ([*TLS_URL, "--cache-redis-tls-ca-file", "{missing}"], "ca-file: .*No such file"),
        ([*TLS_URL, "--cache-redis-tls-ca-file", "{key}"], "ca-file .*NO_CERTIFICATE"),  # a key, not a CA
        (
            [*TLS_URL, "--cache-redis-tls-cert-file", "{cert}", "--cache-redis-tls-key-file", "{server_key}"],
            "KEY_VALUES_MISMATCH",
        ),
    ],
)
def test_tls_options_that_cannot_work_are_refused_at_start(
    tls: TlsFiles, tmp_path: Path, argv: list[str], message: str
) -> None:
    paths = {
        "ca": tls.ca,
        "cert": tls.client.cert,
        "key": tls.client.key,
        "server_key": tls.server.key,
        "missing": tmp_path / "missing.pem",
    }
    with pytest.raises(SystemExit, match=message):
        _config(*(arg.format(**paths) for arg in argv))
