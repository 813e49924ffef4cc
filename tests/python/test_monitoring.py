"""The dashboard and alerting rules in packaging/ against a real kvtierd and a real Prometheus
(Debian's): the rules pass promtool, every metric they name is one kvtierd exports, and
Prometheus scrapes kvtierd and answers for each tier through its HTTP API."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import torch

from conftest import SOURCE_DIR, Kvtierd, RedisServer, block_layers, tokens_for

sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
from kvtier_client import KvtierClient, block_document  # noqa: E402

RULES = os.path.join(SOURCE_DIR, "packaging", "prometheus", "kvtier-rules.yml")
DASHBOARD = os.path.join(SOURCE_DIR, "packaging", "grafana", "kvtier-dashboard.json")
ADMIN_KEY = "monitoring-admin-key-0123456789"
TENANT_KEY = "monitoring-tenant-key-0123456789"
NAMESPACE = "watched-model"
TINY = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "dtype": "BF16"}

needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                      reason="Debian's prometheus package is not installed (scripts/deps.sh installs it)")


def metric_names(text):
    """Every name in `text` that is a kvtier metric, with histogram suffixes taken off."""
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\bkvtier_[a-z0-9_]+", text)}


def exported_families(metrics_text):
    return {m.group(1) for m in re.finditer(r"^# TYPE (kvtier_[a-z0-9_]+) ", metrics_text, re.M)}


def every_tier_server(tmp_path, redis):
    """kvtierd with every tier (GPU on lavapipe here, RAM small enough to spill, SSD, Redis) and
    a tenant with quotas, so every family the dashboard and rules use is exported."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"tenant": "ops", "key": ADMIN_KEY, "admin": True},
        {"tenant": "team", "key": TENANT_KEY, "namespaces": [NAMESPACE]}],
        "quotas": {NAMESPACE: {"ram": "1G", "ssd": "1G"}}}))
    return Kvtierd(tmp_path, ["--layout", "tiny", "--ram-capacity", "256K", "--gpu-memory", "256K",
                              "--ssd-cache-dir", str(tmp_path / "ssd"), "--ssd-capacity", "64M",
                              "--ssd-segment-size", "4M", "--remote", redis.url, "--api-keys", str(keys),
                              "--log-level", "warn"])


def get(url, key=ADMIN_KEY):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def store_blocks(url, n, seed):
    """n blocks of one prompt, PUT by the tenant: RAM fills, spills to the SSD, writes to Redis."""
    client = KvtierClient(url, api_key=TENANT_KEY)
    tokens = tokens_for(seed, 16 * n)
    info = client.layout()
    gen = torch.Generator().manual_seed(seed)
    for i, m in enumerate(client.lookup(NAMESPACE, tokens)["missing"]):
        raw = {l: tuple(t.view(torch.int16).numpy().tobytes() for t in kv)
               for l, kv in enumerate(block_layers(TINY, gen))}
        doc = block_document(info, m["hash"], m["parent_hash"], tokens[16 * i:16 * (i + 1)], NAMESPACE, raw)
        assert client.put_block(m["hash"], doc, namespace=NAMESPACE)
    return tokens


@needs_prometheus
def test_the_alerting_rules_pass_promtool():
    out = subprocess.run(["promtool", "check", "rules", RULES], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_the_dashboard_is_grafana_json_whose_panels_all_query():
    dash = json.load(open(DASHBOARD))
    assert dash["uid"] and dash["title"]
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for p in panels:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert 'instance=~"$instance"' in t["expr"], f"{p['title']}: not filtered by the instance variable"


def test_every_metric_the_dashboard_and_rules_name_is_one_kvtierd_exports(tmp_path):
    used = metric_names(open(DASHBOARD).read()) | metric_names(open(RULES).read())
    with RedisServer(tmp_path) as redis, every_tier_server(tmp_path, redis) as server:
        store_blocks(server.url, 64, 49)  # families with labels appear with their first sample
        exported = exported_families(get(server.url + "/metrics"))
    assert len(used) >= 25
    assert used - exported == set(), f"named but not exported: {sorted(used - exported)}"


@needs_prometheus
def test_prometheus_scrapes_kvtierd_and_answers_for_every_tier(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        prom_port = s.getsockname()[1]
    with RedisServer(tmp_path) as redis, every_tier_server(tmp_path, redis) as server:
        target = urllib.parse.urlparse(server.url).netloc
        (tmp_path / "admin.key").write_text(ADMIN_KEY)
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n"
            "  - job_name: kvtier\n"
            f"    authorization: {{credentials_file: '{tmp_path / 'admin.key'}'}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        try:
            store_blocks(server.url, 64, 50)  # 64 blocks of 16 KiB: GPU and RAM (256K each) spill to the SSD
            # One metric of each tier, as Prometheus saw it. Polled: Prometheus scrapes every second.
            queries = {
                "gpu": 'kvtier_tier_capacity_bytes{tier="gpu"}',
                "ram": 'kvtier_tier_used_bytes{tier="ram"}',
                "ssd": "kvtier_ssd_used_bytes",
                "remote": "kvtier_remote_written_blocks_total",
                "up": 'up{job="kvtier"}',
            }
            seen = {}
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(seen) < len(queries):
                for tier, q in queries.items():
                    if tier in seen:
                        continue
                    try:
                        body = json.loads(urllib.request.urlopen(
                            f"http://127.0.0.1:{prom_port}/api/v1/query?query={urllib.parse.quote(q)}", timeout=5).read())
                    except OSError:
                        break  # Prometheus still starting
                    result = body["data"]["result"]
                    if body["status"] == "success" and result and float(result[0]["value"][1]) > 0:
                        seen[tier] = float(result[0]["value"][1])
                time.sleep(0.2)
            assert set(seen) == set(queries), (
                f"Prometheus answered only {seen}; its log: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            # The rules loaded and evaluate (none fires on a healthy server).
            rules = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=5).read())
            names = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
            assert "KvtierCorruptRecords" in names and "KvtierSsdDirectoryLost" in names
        finally:
            prom.terminate()
            prom.wait(timeout=30)
