"""Every code example in README.md and docs/*.md, run as a reader would run it, so an example can
no longer drift from the code: Python examples run (a document's examples in order, as one
session), and a `print(...)  # value` must print that value; the C example compiles against
kvtier.h and runs; the shell example's requests go to a real kvtierd and their replies are compared
with the ones the README shows; a JSON example is a file kvtierd accepts. A fence in another
language, or an example no test here knows, fails."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import KVTIERD, SOURCE_DIR, Kvtierd

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d ")  # the library's own log, beside what an example prints
DOCS = [os.path.join(SOURCE_DIR, "README.md")] + sorted(glob.glob(os.path.join(SOURCE_DIR, "docs", "*.md")))


def examples(lang=None):
    """(document name, language, code) of every fenced example, in order."""
    out = []
    for path in DOCS:
        with open(path) as f:
            text = f.read()
        name = os.path.relpath(path, SOURCE_DIR)
        for m in FENCE.finditer(text):
            if lang is None or m.group(1) == lang:
                out.append((name, m.group(1), m.group(2)))
    return out


def test_every_example_has_a_runner():
    found = examples()
    assert len(found) >= 6, found
    unknown = [(doc, lang) for doc, lang, _ in found if lang not in ("python", "c", "sh", "json", "jsonl", "jq")]
    assert not unknown, f"examples no test here runs (name the fence's language and add a runner): {unknown}"


def expected_prints(code):
    """The values the `print(...)  # value` lines of `code` promise, in order."""
    return [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*([^:\n]+)", code, re.M)]


@pytest.mark.parametrize("doc", sorted({d for d, _, _ in examples("python")}))
def test_python_examples_run_and_print_what_they_say(doc, tmp_path):
    code = "\n".join(c for d, _, c in examples("python") if d == doc)
    script = code.replace("/nvme/kvtier", str(tmp_path / "nvme"))
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{doc}'s Python examples fail:\n{run.stderr[-3000:]}"
    printed = [line for line in run.stdout.splitlines() if not LOG_LINE.match(line)]
    assert printed == expected_prints(code), run.stdout


def test_the_c_example_compiles_and_runs(tmp_path):
    (doc, _, code), = examples("c")
    library = os.environ["KVTIER_LIBRARY"]
    includes = [line for line in code.splitlines() if line.startswith("#include")]
    body = "\n".join(line for line in code.splitlines() if not line.startswith("#include"))
    program = "\n".join(["#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>"] + includes + [
        "int main(void) {",
        # What the example leaves to its reader: a prompt, and a buffer for what it loads.
        "  uint32_t tokens[1000]; for (size_t i = 0; i < 1000; ++i) tokens[i] = (uint32_t)i;",
        "  size_t n_tokens = 1000, loaded = 0, len = 0; void* buf = NULL;",
        body.replace("/nvme/kvtier", str(tmp_path / "nvme")),
        "  return loaded == 0 ? 0 : 1;", "}"])
    (tmp_path / "example.c").write_text(program)
    exe = tmp_path / "example"
    build = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", os.path.join(SOURCE_DIR, "capi"),
                            str(tmp_path / "example.c"), library, "-o", str(exe),
                            "-Wl,-rpath," + os.path.dirname(library)], capture_output=True, text=True)
    assert build.returncode == 0, f"{doc}'s C example does not compile:\n{build.stderr}\n{program}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{doc}'s C example fails: {run.stdout}{run.stderr}"


def same_reply(shown, got):
    """`got` (a JSON reply) is what the docs show, where "d628…" stands for a hash starting so."""
    if isinstance(shown, str) and shown.endswith("…"):
        return isinstance(got, str) and got.startswith(shown[:-1])
    if isinstance(shown, dict):
        return isinstance(got, dict) and shown.keys() == got.keys() and all(same_reply(shown[k], got[k]) for k in shown)
    if isinstance(shown, list):
        return isinstance(got, list) and len(shown) == len(got) and all(same_reply(a, b) for a, b in zip(shown, got))
    return shown == got


def test_the_shell_example_gets_the_replies_it_shows(tmp_path):
    sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
    import kvtier_client as kc
    (doc, _, code), = examples("sh")
    lines = code.splitlines()
    start = re.match(r"make run &\s+# kvtierd (.*)$", lines[0])
    assert start, f"{doc}'s shell example starts kvtierd with `make run &  # kvtierd FLAGS`"
    flags = start.group(1).replace("./kvtier-data", str(tmp_path / "kvtier-data")).split() + ["--log-level", "warn"]
    with Kvtierd(tmp_path, flags) as server:
        port = server.url.rsplit(":", 1)[1]
        missing = None
        for i, line in enumerate(lines[1:], start=1):
            if not line.startswith("curl"):
                continue
            if "<hash>" in line:
                # The block the lookup above named as missing, as an engine would compute it: its
                # document (docs/server.md) written by the Python client's block_document.
                info = kc.KvtierClient(server.url, binary=False).layout()
                lay = info["layout"]
                tokens = json.loads(re.search(r"-d '(.*)'", lines[i - 2]).group(1))["tokens"][:lay["block_size"]]
                elements = lay["block_size"] * lay["num_kv_heads"] * lay["head_dim"]
                layers = [(bytes(elements * kc.DTYPE_SIZES[s["dtype"]]),) * 2 for s in lay["layers"]]
                (tmp_path / "block.safetensors").write_bytes(kc.block_document(
                    info, missing["hash"], missing["parent_hash"], tokens, "my-model", layers))
                line = line.replace("<hash>", missing["hash"])
            command = line.replace("localhost:8417", "127.0.0.1:" + port)
            run = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, f"{doc}: `{line}` failed: {run.stderr}"
            shown = lines[i + 1][2:] if i + 1 < len(lines) and lines[i + 1].startswith("# {") else None
            if shown is not None:
                got = json.loads(run.stdout)
                assert same_reply(json.loads(shown), got), f"{doc} shows {shown}\nkvtierd answers {run.stdout}"
                missing = got["missing"][0] if got.get("missing") else missing
            else:
                assert run.stdout.strip(), f"{doc}: `{line}` printed nothing"
        lookup = kc.KvtierClient(server.url, binary=False).lookup("my-model", list(range(1, 18)))
        assert lookup["matched_tokens"] == 16, "the PUT block is found"
    assert server.stop() == 0


def test_the_access_log_examples_are_what_kvtierd_writes_and_the_jq_reads_it(tmp_path):
    """The access-log line docs/operations.md shows has the keys and types of a real lookup's line,
    and its jq command, run on a real log, gives each tenant's lookups and hit ratio."""
    sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
    import kvtier_client as kc
    (doc, _, line), = examples("jsonl")
    (_, _, jq), = examples("jq")
    shown = json.loads(line)
    log = tmp_path / "access.jsonl"
    with Kvtierd(tmp_path, ["--layout", "tiny", "--access-log", str(log), "--log-level", "warn"]) as server:
        client = kc.KvtierClient(server.url, binary=False)
        info = client.layout()
        lay = info["layout"]
        tokens = list(range(1, 33))
        missing = client.lookup("m", tokens)["missing"][0]
        elements = lay["block_size"] * lay["num_kv_heads"] * lay["head_dim"]
        layers = [(bytes(elements * kc.DTYPE_SIZES[s["dtype"]]),) * 2 for s in lay["layers"]]
        assert client.put_block(missing["hash"], kc.block_document(info, missing["hash"], missing["parent_hash"],
                                                                   tokens[:16], "m", layers))
        client.lookup("m", tokens)
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    real = [l for l in lines if l["route"] == "lookup"][-1]
    assert real.keys() == shown.keys(), f"{doc} shows {sorted(shown)}, kvtierd writes {sorted(real)}"
    for k in shown:
        assert type(real[k]) is type(shown[k]) or real[k] is None or shown[k] is None, k
    run = subprocess.run(["bash", "-c", jq.strip()], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"{doc}'s jq example failed: {run.stderr}"
    assert json.loads(run.stdout) == [{"tenant": None, "lookups": 2, "hit_ratio": 16 / 64}]


def test_json_examples_are_files_kvtierd_accepts(tmp_path):
    for doc, _, code in examples("json"):
        table = json.loads(code)
        assert "keys" in table, f"{doc}: a JSON example other than an --api-keys file needs a runner here"
        path = tmp_path / "keys.json"
        path.write_text(code)
        with Kvtierd(tmp_path, ["--layout", "tiny", "--api-keys", str(path), "--log-level", "warn"]) as server:
            import urllib.request
            key = next(k["key"] for k in table["keys"] if "key" in k)
            req = urllib.request.Request(server.url + "/v1/layout", headers={"Authorization": "Bearer " + key})
            assert json.loads(urllib.request.urlopen(req).read())["layout"]["block_size"] > 0
            for k in table["keys"]:
                if "key_sha256" in k:
                    assert re.fullmatch(r"[0-9a-f]{64}", k["key_sha256"]), f"{doc}: key_sha256 is 64 hex digits"
        assert server.stop() == 0
