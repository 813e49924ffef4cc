"""A client of kvtierd's HTTP API in one file, standard library only.

    from kvtier_client import KvtierClient, block_document
    c = KvtierClient("http://127.0.0.1:8417", api_key=None)
    info = c.layout()                       # the server's KV layout and its fingerprint
    found = c.lookup("my-model", tokens)    # cached prefix + what is missing (hash, parent_hash)
    doc = block_document(info, hash, parent_hash, block_tokens, "my-model", {0: (k_bytes, v_bytes), ...})
    c.put_block(hash, doc); c.get_block(hash)

Blocks are safetensors documents (8-byte little-endian header length, JSON header, raw data);
KV bytes are passed through untouched, so bf16 stays bf16, bit for bit.
"""
import json
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


class KvtierClient:
    def __init__(self, url="http://127.0.0.1:8417", api_key=None, timeout=60, ca_cert=None):
        """url https://... talks TLS; ca_cert is the PEM file to trust (default: the system's CAs)."""
        self.url, self.api_key, self.timeout = url.rstrip("/"), api_key, timeout
        self._tls = ssl.create_default_context(cafile=ca_cert) if self.url.startswith("https://") else None

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
        status, _ = self._request("PUT", self._block_path(block_hash, namespace), document, "application/octet-stream")
        return status == 201

    def get_block(self, block_hash, namespace=None):
        """The block's document, or None when it is not cached."""
        path = self._block_path(block_hash, namespace)
        try:
            return self._request("GET", path)[1]
        except KvtierError as e:
            if e.status == 404:
                return None
            raise

    def batch_get(self, hashes, namespace=None):
        """A list with each hash's document, or None for a miss."""
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
