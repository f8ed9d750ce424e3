"""Loading models by Hugging Face repo id, against a fake Hub on 127.0.0.1 (tests/fakehub.py).

deploycc runs in a subprocess because huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE
at import. Checked: the snapshot lands in the normal cache layout under HF_HOME; only the files
deploycc needs are fetched (not pytorch_model.bin, README.md, onnx/); a tag gives its own file set;
a second run works offline from the cache with no server; the CLI reports an unknown repo, an unknown
revision and an empty offline cache in one line; a model from the Hub gives the same reference
logits as the same directory on disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deploycc
from deploycc.export import export
from deploycc.session import lower
from fakehub import FakeHub
from fixtures import make_tiny

REPO = "org/tiny"
MAIN_MODEL, V1_MODEL = "llama-gqa1", "qwen2-gqa5-tied"
NEEDED_MAIN = {"config.json", "generation_config.json", "model.safetensors"}
NEEDED_V1 = {"config.json", "model.safetensors"}
UNWANTED = {"pytorch_model.bin", "README.md", "onnx/model.onnx", ".gitattributes"}
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]

# Runs in the child: load by repo id, print what landed where, optionally save reference logits.
LOAD = """
import json, sys
import numpy as np
import deploycc
source, revision, logits_out = sys.argv[1], sys.argv[2] or None, sys.argv[3]
m = deploycc.load_model(source, revision=revision)
if logits_out:
    np.save(logits_out, deploycc.reference_session(m).prefill(json.loads(sys.argv[4]), all_logits=True))
print(json.dumps({"path": str(m.path), "architecture": m.architecture, "vocab_size": m.config.vocab_size,
                  "files": sorted(p.relative_to(m.path).as_posix() for p in m.path.rglob("*") if p.is_file())}))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """org/tiny: `main` is a llama with files deploycc must skip; tag `v1` is a qwen2 with fewer files."""
    root = tmp_path_factory.mktemp("hub")
    main, v1 = root / "main", root / "v1"
    shutil.copytree(make_tiny(MAIN_MODEL), main)
    (main / "README.md").write_text("# tiny\n")
    (main / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (main / "pytorch_model.bin").write_bytes(b"\x80\x02pickle, never to be fetched" * 64)
    (main / "onnx").mkdir()
    (main / "onnx" / "model.onnx").write_bytes(b"onnx" * 256)
    v1.mkdir()
    for name in NEEDED_V1:
        shutil.copy(make_tiny(V1_MODEL) / name, v1 / name)
    (v1 / "README.md").write_text("# tiny v1\n")
    with FakeHub({REPO: {"main": main, "v1": v1}}) as h:
        yield h


@pytest.fixture
def closed_endpoint():
    """An http URL on which nothing listens (connection refused), standing in for an unreachable Hub."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hf_env(hf_home: Path, endpoint: str, offline: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="1" if offline else "0",
               HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


def load_in_child(env: dict, source: str = REPO, revision: str | None = None, logits_out: Path | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", LOAD, source, revision or "", str(logits_out or ""), json.dumps(PROMPT)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploycc", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def local_ir(model_dir: Path) -> str:
    return str(lower(export(deploycc.load_model(str(model_dir))), "exported"))


def repo_cache(hf_home: Path, repo: str = REPO) -> Path:
    return hf_home / "hub" / f"models--{repo.replace('/', '--')}"


def test_download_lands_in_hf_cache_with_only_needed_files(hub, tmp_path, closed_endpoint):
    before = hub.downloaded(REPO)
    got = load_in_child(hf_env(tmp_path, hub.url, offline=False))
    sha, cache = hub.sha(REPO, "main"), repo_cache(tmp_path)
    snapshot = cache / "snapshots" / sha
    assert Path(got["path"]) == snapshot
    assert (cache / "refs" / "main").read_text() == sha
    assert got["architecture"] == "LlamaForCausalLM" and set(got["files"]) == NEEDED_MAIN
    for name in NEEDED_MAIN:  # the normal layout: snapshot entries point into blobs/, named by ETag
        blob = (snapshot / name).resolve()
        assert blob.parent == (cache / "blobs").resolve()
        assert blob.name == hashlib.sha256(blob.read_bytes()).hexdigest()
    fetched = hub.downloaded(REPO) - before
    assert fetched == {name: 1 for name in NEEDED_MAIN}
    assert not UNWANTED & set(fetched)

    # Online again: metadata only, nothing downloaded twice.
    assert load_in_child(hf_env(tmp_path, hub.url, offline=False)) == got
    assert hub.downloaded(REPO) - before == {name: 1 for name in NEEDED_MAIN}

    # Offline, with no server at all: straight from the cache, and the fake hub sees nothing.
    n = hub.total_requests()
    assert load_in_child(hf_env(tmp_path, closed_endpoint, offline=True)) == got
    assert hub.total_requests() == n


@pytest.mark.parametrize("revision", ["v1", "commit"])
def test_revision_gives_its_own_file_set(hub, tmp_path, revision):
    sha = hub.sha(REPO, "v1")
    rev = sha if revision == "commit" else revision
    before = hub.downloaded(REPO)
    r = cli(hf_env(tmp_path, hub.url, offline=False), "inspect", REPO, "--revision", rev, "--stage", "exported")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout == local_ir(make_tiny(V1_MODEL))
    snapshot = repo_cache(tmp_path) / "snapshots" / sha
    assert {p.name for p in snapshot.iterdir()} == NEEDED_V1
    assert not (repo_cache(tmp_path) / "snapshots" / hub.sha(REPO, "main")).exists()
    assert hub.downloaded(REPO) - before == {name: 1 for name in NEEDED_V1}
    refs = repo_cache(tmp_path) / "refs"
    if revision == "v1":
        assert (refs / "v1").read_text() == sha
    else:  # a commit id needs no resolving and records no ref
        assert not refs.exists() or not any(refs.iterdir())


def test_cli_inspect_from_hub_matches_local_directory(hub, tmp_path):
    r = cli(hf_env(tmp_path, hub.url, offline=False), "inspect", REPO, "--stage", "exported")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout == local_ir(make_tiny(MAIN_MODEL))
    assert (repo_cache(tmp_path) / "snapshots" / hub.sha(REPO, "main") / "model.safetensors").exists()


def test_hub_model_logits_equal_local_directory(hub, tmp_path):
    out = tmp_path / "logits.npy"
    load_in_child(hf_env(tmp_path / "hf", hub.url, offline=False), logits_out=out)
    local = deploycc.reference_session(deploycc.load_model(str(make_tiny(MAIN_MODEL)))).prefill(PROMPT, all_logits=True)
    from_hub = np.load(out)
    assert from_hub.shape == (len(PROMPT), 101)
    assert np.array_equal(from_hub, local)


def test_prefilled_cache_loads_offline_without_a_server(tmp_path, closed_endpoint):
    """A cache laid out by hand as huggingface_hub writes it (blobs/, snapshots/<sha>/ links, refs/main)."""
    src, sha = make_tiny(MAIN_MODEL), "0123456789abcdef0123456789abcdef01234567"
    cache = repo_cache(tmp_path, "acme/cached")
    (cache / "blobs").mkdir(parents=True)
    (cache / "snapshots" / sha).mkdir(parents=True)
    (cache / "refs").mkdir()
    (cache / "refs" / "main").write_text(sha)
    for name in NEEDED_MAIN:
        data = (src / name).read_bytes()
        blob = cache / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (cache / "snapshots" / sha / name).symlink_to(Path("..", "..", "blobs", blob.name))
    env = hf_env(tmp_path, closed_endpoint, offline=True)
    got = load_in_child(env, "acme/cached")
    assert Path(got["path"]) == cache / "snapshots" / sha
    assert got["architecture"] == "LlamaForCausalLM" and got["vocab_size"] == 101
    r = cli(env, "inspect", "acme/cached")
    assert r.returncode == 0, r.stderr
    assert r.stdout == local_ir(src)


@pytest.mark.parametrize("case", ["unknown repo", "unknown revision", "offline, empty cache", "hub unreachable"])
def test_cli_hub_errors_are_one_line(hub, tmp_path, closed_endpoint, case):
    args, env, needles = {
        "unknown repo": (["org/missing"], hf_env(tmp_path, hub.url, offline=False),
                         ["org/missing was not found"]),
        "unknown revision": ([REPO, "--revision", "v9"], hf_env(tmp_path, hub.url, offline=False),
                             ["revision v9 of org/tiny was not found"]),
        "offline, empty cache": ([REPO], hf_env(tmp_path, hub.url, offline=True),
                                 ["org/tiny is not in the local Hugging Face cache", "HF_HUB_OFFLINE=1"]),
        "hub unreachable": ([REPO], hf_env(tmp_path, closed_endpoint, offline=False),
                            ["org/tiny is not in the local Hugging Face cache"]),
    }[case]
    n = hub.total_requests()
    assert_one_line_error(cli(env, "inspect", *args), *needles)
    if case == "offline, empty cache":
        assert hub.total_requests() == n
    assert not (repo_cache(tmp_path) / "snapshots").exists() or not any((repo_cache(tmp_path) / "snapshots").iterdir())
