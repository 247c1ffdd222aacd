#!/usr/bin/env python3
"""Writes the fuzzers' seed inputs into fuzz/seeds/<target>/ (small, deterministic).

Archives are made here rather than by `docker save` so they stay a few KiB: the fuzzer
mutates small inputs far faster. They follow the two layouts `docker save` writes.
"""
import hashlib, io, json, os, tarfile, pathlib

ROOT = pathlib.Path(__file__).resolve().parent
PROJECT = ROOT.parent
SEEDS = ROOT / "seeds"


def put(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def tar_bytes(entries):
    """entries: (name, bytes | ('symlink', target))"""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, body in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if isinstance(body, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, body[1]
                t.addfile(info)
            else:
                info.size = len(body)
                t.addfile(info, io.BytesIO(body))
    return out.getvalue()


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


layer = tar_bytes([("hello.txt", b"hello\n"), ("bin/sh", ("symlink", "busybox"))])
config = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Env": ["PATH=/bin"], "Labels": {"dev.hallmark.checksum": "ab" * 32}},
    "rootfs": {"type": "layers", "diff_ids": [sha(layer)]},
    "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "hallmark"}],
}).encode()

# Docker 20.10: <id>/layer.tar, <config>.json, manifest.json.
config_name = sha(config)[7:] + ".json"
put("archive", "docker-archive.tar", tar_bytes([
    ("0123abcd/layer.tar", layer),
    (config_name, config),
    ("manifest.json", json.dumps([{"Config": config_name, "RepoTags": ["x:1"],
                                   "Layers": ["0123abcd/layer.tar"]}]).encode()),
]))
# Docker 25+: an OCI layout with a docker manifest.json beside it; a layer as a symlink.
manifest = json.dumps({
    "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
               "digest": sha(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": sha(layer), "size": len(layer)}],
}).encode()
put("archive", "oci-layout.tar", tar_bytes([
    ("blobs/sha256/" + sha(config)[7:], config),
    ("blobs/sha256/" + sha(layer)[7:], layer),
    ("blobs/sha256/" + sha(manifest)[7:], manifest),
    ("index.json", json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": sha(manifest), "size": len(manifest)}]}).encode()),
    ("manifest.json", json.dumps([{"Config": "blobs/sha256/" + sha(config)[7:],
                                   "RepoTags": ["x:1"],
                                   "Layers": ["blobs/sha256/" + sha(layer)[7:]]}]).encode()),
    ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
    ("layer-link", ("symlink", "blobs/sha256/" + sha(layer)[7:])),
]))

# Specs with their pins, `spec \0 pins`.
for image in sorted((PROJECT / "images").iterdir()):
    pins = PROJECT / "pins" / f"{image.name}.toml"
    put("spec", image.name, (image / "image.toml").read_bytes() + b"\0" +
        (pins.read_bytes() if pins.exists() else b""))

# Series and a patch, `series \0 patch`.
put("series", "git-diff", b"# fixes\nfix-x.patch -p1\nother.patch\n\0"
    b"diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n"
    b"@@ -1 +1 @@\n-a\n+b\n")
put("series", "rename", b"r.patch -p0\n\0diff --git a/a b/b\nrename from a\nrename to b\n")

# Engine answers: an image inspect, a load progress line, a config, a probe answer.
put("engine_answers", "inspect.json", json.dumps({
    "Id": sha(config), "RepoTags": ["x:1"], "Architecture": "amd64", "Os": "linux",
    "Config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/sh"],
               "Labels": {"dev.hallmark.checksum": "ab" * 32}},
    "RootFS": {"Type": "layers", "Layers": [sha(layer)]}, "Size": 10}))
put("engine_answers", "load.json", '{"stream":"Loaded image: x:1\\n"}')
put("engine_answers", "load-error.json",
    '{"errorDetail":{"message":"unexpected EOF"},"error":"unexpected EOF"}')
put("engine_answers", "config.json", config)
put("engine_answers", "probe.json", json.dumps({
    "purelib": "/usr/lib/python3/dist-packages", "scripts": "/usr/bin", "data": "/usr",
    "include": "/usr/include/python3.11", "executable": "/usr/bin/python3",
    "version": "3.11", "machine": "x86_64"}))
