"""Docs that cannot drift: every flag of `kvtierd --help`, every route kvtierd serves, every public
method of kvtier.Cache and every function of kvtier.h is documented, and every link inside the
docs leads somewhere. A new flag, route or method without its line fails here."""
import inspect
import os
import re
import subprocess

import pytest

import kvtier
from conftest import KVTIERD, SOURCE_DIR

DOCS = os.path.join(SOURCE_DIR, "docs")


def doc(name):
    with open(os.path.join(DOCS, name)) as f:
        return f.read()


def test_every_kvtierd_flag_is_in_server_md():
    help_text = subprocess.run([KVTIERD, "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", help_text))
    assert {"--ssd-cache-dir", "--api-keys", "--max-body-memory", "--no-persist-on-shutdown"} <= flags
    documented = doc("server.md")
    missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![a-z0-9-])", documented))
    assert not missing, f"flags of kvtierd --help missing from docs/server.md: {missing}"


def served_routes():
    """(method, path) of every route registered in the HTTP door's source."""
    with open(os.path.join(SOURCE_DIR, "server", "http", "http_routes.cc")) as f:
        src = f.read()
    hash_route = re.search(r'kHashRoute = R"\((.*?)\)"', src).group(1)
    routes = set()
    for method, path in re.findall(r'\bs\.(Get|Put|Delete|Post)\(\s*("[^"]*"|kHashRoute)', src):
        routes.add((method.upper(), path.strip('"') if path != "kHashRoute" else hash_route))
    for path in re.findall(r'\bpost_json\(\s*s,\s*"([^"]+)"', src):
        routes.add(("POST", path))
    return routes


def test_every_route_kvtierd_serves_is_in_server_md():
    routes = served_routes()
    assert len(routes) >= 10, routes
    documented = doc("server.md")
    missing = []
    for method, path in sorted(routes):
        shown = re.sub(r"\(\[\^/:\]\+\)", "{hash}", path)  # the block routes' regex, as the docs write it
        if shown not in documented:
            missing.append(f"{method} {shown}")
    assert not missing, f"routes missing from docs/server.md: {missing}"


def test_every_public_method_of_kvtier_cache_is_in_python_md():
    names = [n for n, _ in inspect.getmembers(kvtier.Cache) if not n.startswith("_")]
    assert {"lookup", "load_blocks", "save_blocks", "fetch", "close"} <= set(names)
    documented = doc("python.md")
    missing = [n for n in names if not re.search(r"`" + re.escape(n) + r"[`(]", documented)]
    assert not missing, f"kvtier.Cache members missing from docs/python.md: {missing}"


def test_every_function_of_kvtier_h_is_in_c_api_md():
    with open(os.path.join(SOURCE_DIR, "capi", "kvtier.h")) as f:
        functions = set(re.findall(r"\b(kvtier_[a-z_]+)\(", f.read()))
    assert "kvtier_load_prefix" in functions
    documented = doc("c-api.md")
    missing = sorted(f for f in functions if f"`{f}`" not in documented)
    assert not missing, f"functions of kvtier.h missing from docs/c-api.md: {missing}"


def anchors(markdown):
    """GitHub's heading anchors: lower case, punctuation but - and _ dropped, spaces to -."""
    out = set()
    for heading in re.findall(r"^#+ +(.+?) *$", markdown, re.M):
        text = re.sub(r"[`*]", "", heading).strip().lower()
        out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", ["README.md"] + [os.path.join("docs", n) for n in sorted(os.listdir(DOCS))
                                                  if n.endswith(".md")])
def test_every_link_inside_the_docs_leads_somewhere(page):
    path = os.path.join(SOURCE_DIR, page)
    with open(path) as f:
        text = f.read()
    # Links outside fenced code: [text](target) and ![alt](target).
    text_outside_code = re.sub(r"```.*?```", "", text, flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text_outside_code):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            broken.append(f"{target}: no such file")
            continue
        if anchor and resolved.endswith(".md"):
            with open(resolved) as f:
                if anchor not in anchors(f.read()):
                    broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page}: {broken}"


@pytest.mark.parametrize("program", ["KVTIER_KVTIERD", "KVTIER_CLI", "KVTIER_FSCK"])
def test_version_says_what_the_binary_was_built_from(program):
    binary = os.environ.get(program)
    assert binary, f"{program} is not set"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    first = out.splitlines()[0]
    assert re.match(r"kvtier(d|-fsck)? \d+\.\d+\.\d+ \(git ([0-9a-f]{12}(-dirty)?|unknown), (Release|Debug|RelWithDebInfo|MinSizeRel)",
                    first), first
    for what in ("compiler: ", "vulkan: ", "glslang: "):
        line = next((l for l in out.splitlines() if l.startswith(what)), "")
        assert len(line) > len(what), f"no {what!r} line in {out!r}"
    if os.path.isdir(os.path.join(SOURCE_DIR, ".git")):
        # A commit of this repository (HEAD when the build was configured; the Makefile configures
        # on every build, a bare ctest after a commit may still name the one before).
        revision = re.search(r"\(git ([0-9a-f]{12})", first).group(1)
        known = subprocess.run(["git", "-C", SOURCE_DIR, "cat-file", "-e", revision + "^{commit}"],
                               capture_output=True)
        assert known.returncode == 0, f"{first} names no commit of this repository"
