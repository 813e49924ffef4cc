"""The standard-library Python client against kvtierd over TLS, with a self-signed certificate made
for the test: blocks round-trip bit for bit over the binary port inside TLS and over HTTPS; a
client that does not trust the certificate gets an error, not a block."""
import os
import ssl
import subprocess
import sys
import urllib.error

import pytest

from conftest import SOURCE_DIR, Kvtierd

sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
from kvtier_client import KvtierClient, KvtierError, _WireConnection, block_document  # noqa: E402

NAMESPACE = "tls-model"
KEY = "python-tls-key-0123456789"


@pytest.fixture
def cert(tmp_path):
    out = subprocess.run([os.environ["KVTIER_MAKE_TEST_CERT"], str(tmp_path)], check=True,
                         capture_output=True, text=True).stdout.split()
    return out[0], out[1]


def test_blocks_round_trip_over_https_and_an_untrusting_client_gets_nothing(tmp_path, cert):
    cert_path, key_path = cert
    tokens = list(range(1000, 1000 + 3 * 16))
    args = ["--layout", "tiny", "--tls-cert", cert_path, "--tls-key", key_path, "--api-key", KEY,
            "--log-level", "warn"]
    with Kvtierd(tmp_path, args) as server:
        assert server.url.startswith("https://127.0.0.1:")
        client = KvtierClient(server.url, api_key=KEY, ca_cert=cert_path)
        info = client.layout()
        missing = client.lookup(NAMESPACE, tokens)["missing"]
        assert len(missing) == 3
        docs = {}
        for i, m in enumerate(missing):
            raw = {l: (os.urandom(4096), os.urandom(4096)) for l in range(2)}
            docs[m["hash"]] = block_document(info, m["hash"], m["parent_hash"], tokens[16 * i:16 * (i + 1)],
                                             NAMESPACE, raw)
            assert client.put_block(m["hash"], docs[m["hash"]])
        assert client.binary_in_use(), "blocks go over the binary port, inside TLS"
        for h, doc in docs.items():
            assert client.get_block(h) == doc
        assert client.batch_get(list(docs)) == list(docs.values())
        assert client.lookup(NAMESPACE, tokens)["matched_tokens"] == 48
        over_https = KvtierClient(server.url, api_key=KEY, ca_cert=cert_path, binary=False)
        assert not over_https.binary_in_use()
        for h, doc in docs.items():
            assert over_https.get_block(h) == doc

        # The binary port with a context that does not trust the certificate: refused, named.
        port = client.healthz()["binary_port"]
        untrusting = _WireConnection("127.0.0.1", port, KEY, 10, ssl.create_default_context())
        with pytest.raises(KvtierError) as not_trusted:
            untrusting._exchange(3, bytes.fromhex(next(iter(docs))), NAMESPACE, b"")
        assert "not trusted" in str(not_trusted.value)

        with pytest.raises(urllib.error.URLError) as refused:
            KvtierClient(server.url, api_key=KEY).layout()  # the system's CAs do not know this certificate
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
        with pytest.raises(KvtierError) as unauthenticated:
            KvtierClient(server.url, ca_cert=cert_path).layout()
        assert unauthenticated.value.status == 401
    assert server.proc.returncode == 0
