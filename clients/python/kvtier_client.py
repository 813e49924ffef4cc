"""A client of kvtierd in one file, standard library only.

    from kvtier_client import KvtierClient, block_document
    c = KvtierClient("http://127.0.0.1:8417", api_key=None)
    info = c.layout()                       # the server's KV layout and its fingerprint
    found = c.lookup("my-model", tokens)    # cached prefix + what is missing (hash, parent_hash)
    doc = block_document(info, hash, parent_hash, block_tokens, "my-model", {0: (k_bytes, v_bytes), ...})
    c.put_block(hash, doc); c.get_block(hash)

Blocks are safetensors documents (8-byte little-endian header length, JSON header, raw data);
KV bytes are passed through untouched, so bf16 stays bf16, bit for bit. Blocks travel over the
server's binary port (docs/wire-protocol.md) when its /healthz offers one (inside TLS, with the
same certificate check, when the URL is https); everything else, and every block when
binary=False, over HTTP.
"""
import json
import socket
import ssl
import struct
import urllib.error
import urllib.parse
import urllib.request

DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}


class KvtierError(Exception):
    """An HTTP error from kvtierd: .status is the HTTP status, .code and the message its JSON error."""

    def __init__(self, status, code, message):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


_MAGIC = b"KVT1"
_OP_HELLO, _OP_PUT, _OP_GET, _OP_BATCH_GET, _OP_DELETE = 1, 2, 3, 4, 5
_STREAMED = (1 << 64) - 1


class _WireConnection:
    """One connection to the binary port; every op is idempotent, so a closed one is retried once."""

    def __init__(self, host, port, api_key, timeout, tls=None):
        self.address, self.api_key, self.timeout, self.sock = (host, port), api_key, timeout, None
        self.tls = tls  # an ssl.SSLContext: the port speaks TLS, the certificate checked as for HTTPS

    def _connect(self):
        sock = socket.create_connection(self.address, timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=self.address[0])
            except ssl.SSLCertVerificationError as e:
                sock.close()
                raise KvtierError(0, "tls", "the server's certificate is not trusted: %s" % e.verify_message) from None
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        if self.api_key:
            self._exchange(_OP_HELLO, b"\0" * 32, "", self.api_key.encode(), retry=False)

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def recv_exact(self, n):
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("kvtierd closed the connection")
            got += k
        return bytes(buf)

    def _exchange(self, op, block_hash, namespace, body, retry=True):
        """Sends a request; returns (status, body_len) with the body (if any) still to read."""
        fresh = self.sock is None
        try:
            if fresh:
                self._connect()
            ns = (namespace or "").encode()
            head = _MAGIC + struct.pack("<BBHQ", op, 0, len(ns), len(body)) + block_hash
            self.sock.sendall(head + ns)
            if body:
                self.sock.sendall(body)
            reply = self.recv_exact(16)
        except (ConnectionError, OSError):
            self.close()
            if fresh or not retry:
                raise
            return self._exchange(op, block_hash, namespace, body, retry=False)
        if reply[:4] != _MAGIC:
            self.close()
            raise KvtierError(0, "protocol", "not a kvtier binary reply")
        status, _, length = struct.unpack_from("<HHQ", reply, 4)
        if status >= 400:
            raw = self.recv_exact(length)
            try:
                err = json.loads(raw)["error"]
                raise KvtierError(status, err["code"], err["message"])
            except (ValueError, KeyError):
                raise KvtierError(status, "http_error", raw.decode(errors="replace")) from None
        return status, length


class KvtierClient:
    def __init__(self, url="http://127.0.0.1:8417", api_key=None, timeout=60, ca_cert=None, binary=True):
        """url https://... talks TLS; ca_cert is the PEM file to trust (default: the system's CAs).
        binary=False keeps blocks on HTTP even when the server offers its binary port."""
        self.url, self.api_key, self.timeout = url.rstrip("/"), api_key, timeout
        self._tls = ssl.create_default_context(cafile=ca_cert) if self.url.startswith("https://") else None
        self._binary_allowed = binary
        self._wire = None
        self._wire_checked = False

    def binary_in_use(self):
        """Whether blocks go over the binary port (asks the server once)."""
        if not self._wire_checked:
            self._wire_checked = True
            if self._binary_allowed:
                health = self.healthz()
                port = health.get("binary_port")
                # The port speaks TLS exactly when HTTP does: a verifying client never takes a
                # clear-text port, and a clear-text one cannot talk to a TLS port.
                if port and bool(health.get("binary_tls")) == (self._tls is not None):
                    host = urllib.parse.urlsplit(self.url).hostname
                    self._wire = _WireConnection(host, port, self.api_key, self.timeout, self._tls)
        return self._wire is not None

    def _request(self, method, path, body=None, content_type="application/json"):
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", content_type)
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._tls) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)["error"]
                raise KvtierError(e.code, err["code"], err["message"]) from None
            except (ValueError, KeyError):
                raise KvtierError(e.code, "http_error", raw.decode(errors="replace")) from None

    def _json(self, method, path, payload=None):
        body = None if payload is None else json.dumps(payload).encode()
        return json.loads(self._request(method, path, body)[1])

    def healthz(self):
        return self._json("GET", "/healthz")

    def layout(self):
        return self._json("GET", "/v1/layout")

    def stats(self):
        return self._json("GET", "/v1/stats")

    def lookup(self, namespace, tokens, extra_keys=()):
        return self._json("POST", "/v1/lookup",
                          {"namespace": namespace, "tokens": list(tokens), "extra_keys": list(extra_keys)})

    def prefetch(self, namespace, tokens, extra_keys=()):
        return self._json("POST", "/v1/prefetch",
                          {"namespace": namespace, "tokens": list(tokens), "extra_keys": list(extra_keys)})

    @staticmethod
    def _block_path(block_hash, namespace):
        return "/v1/blocks/" + block_hash + ("?namespace=" + urllib.parse.quote(namespace) if namespace else "")

    def put_block(self, block_hash, document, namespace=None):
        """True if stored (201), False if the server already held it (200)."""
        if self.binary_in_use():
            status, _ = self._wire._exchange(_OP_PUT, bytes.fromhex(block_hash), namespace, document)
            return status == 201
        status, _ = self._request("PUT", self._block_path(block_hash, namespace), document, "application/octet-stream")
        return status == 201

    def put_state(self, block_hash, document, namespace=None):
        """A hybrid model's state snapshot (a kvtier.state.v1 document) at the end of the cached
        block `block_hash`: True if stored (201), False if the server already held it (200)."""
        path = self._block_path(block_hash, namespace).replace("/v1/blocks/", "/v1/states/", 1)
        status, _ = self._request("PUT", path, document, "application/octet-stream")
        return status == 201

    def get_state(self, block_hash, namespace=None):
        """The state document of the snapshot at the end of block `block_hash`, or None."""
        return self._get_or_none(self._block_path(block_hash, namespace).replace("/v1/blocks/", "/v1/states/", 1))

    def _get_or_none(self, path):
        try:
            return self._request("GET", path)[1]
        except KvtierError as e:
            if e.status == 404:
                return None
            raise

    def get_block(self, block_hash, namespace=None):
        """The block's document, or None when it is not cached."""
        if self.binary_in_use():
            try:
                _, length = self._wire._exchange(_OP_GET, bytes.fromhex(block_hash), namespace, b"")
            except KvtierError as e:
                if e.status == 404:
                    return None
                raise
            return self._wire.recv_exact(length)
        return self._get_or_none(self._block_path(block_hash, namespace))

    def batch_get(self, hashes, namespace=None):
        """A list with each hash's document, or None for a miss."""
        if self.binary_in_use():
            hashes = list(hashes)
            body = b"".join(bytes.fromhex(h) for h in hashes)
            _, length = self._wire._exchange(_OP_BATCH_GET, b"\0" * 32, namespace, body)
            if length != _STREAMED:
                self._wire.close()
                raise KvtierError(0, "protocol", "a batch GET reply without its item stream")
            out = []
            for _ in hashes:
                (n,) = struct.unpack("<Q", self._wire.recv_exact(8))
                out.append(self._wire.recv_exact(n) if n else None)
            return out
        payload = {"hashes": list(hashes)}
        if namespace:
            payload["namespace"] = namespace
        _, body = self._request("POST", "/v1/blocks:batchGet", json.dumps(payload).encode())
        out, pos = [], 0
        while pos < len(body):
            (n,) = struct.unpack_from("<Q", body, pos)
            pos += 8
            out.append(body[pos:pos + n] if n else None)
            pos += n
        return out

    def delete_block(self, block_hash, namespace=None):
        if self.binary_in_use():
            self._wire._exchange(_OP_DELETE, bytes.fromhex(block_hash), namespace, b"")
            return
        self._request("DELETE", self._block_path(block_hash, namespace))


def block_document(info, block_hash, parent_hash, tokens, namespace, layers, extra_keys=()):
    """A block document for the server's layout `info` (from layout()).

    layers: {layer index: (k_bytes, v_bytes)}, each [block_size, num_kv_heads, head_dim] in the
    layer's dtype, little-endian, for every layer of the layout.
    """
    layout = info["layout"]
    shape = [layout["block_size"], layout["num_kv_heads"], layout["head_dim"]]
    elements = shape[0] * shape[1] * shape[2]
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    # The server's canonical form (sorted metadata keys, compact JSON), so what GET returns is
    # byte for byte what was PUT.
    metadata = {
        "extra_keys": json.dumps(list(extra_keys), **compact),
        "format": "kvtier.block.v1",
        "hash": block_hash,
        "layout_fingerprint": info["fingerprint"],
        "namespace": namespace,
        "parent_hash": parent_hash,
        "token_ids": ",".join(str(t) for t in tokens),
    }
    header = {"__metadata__": metadata}
    data, offset = [], 0
    for i, spec in enumerate(layout["layers"]):
        k, v = layers[i]
        for name, part in (("k", k), ("v", v)):
            size = elements * DTYPE_SIZES[spec["dtype"]]
            if len(part) != size:
                raise ValueError(f"layer {i} {name}: {len(part)} bytes, the layout needs {size}")
            header[f"layers.{i}.{name}"] = {"dtype": spec["dtype"], "shape": shape,
                                            "data_offsets": [offset, offset + size]}
            data.append(part)
            offset += size
    text = json.dumps(header, **compact).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + b"".join(data)
