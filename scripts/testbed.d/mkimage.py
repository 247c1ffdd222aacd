#!/usr/bin/python3
"""Deterministic base images for scripts/testbed (standard library only).

  mkimage.py busybox-layer --busybox /bin/busybox --out layer.tar
      A layer tar holding /bin/busybox, a symlink per applet, /etc/passwd, /etc/group, /tmp,
      /root: entries sorted, mtime 0, uid/gid 0, fixed modes. Same busybox binary, same bytes.

  mkimage.py archive --layer layer.tar --tag NAME:TAG --arch ARCH [--variant V]
                     [--cmd JSON] [--env K=V]... [--created-by TEXT] --out image.tar
      A docker-archive (what `docker save` wrote before Docker 25: manifest.json, <id>.json,
      <diffid>/layer.tar) of one layer with a fixed config ("created": 1970-01-01T00:00:00Z),
      loadable by `docker load` on Docker 20.10 and on the containerd image store. The same
      layer gives the same bytes, so the same image ID, on every machine.
"""

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

EPOCH = "1970-01-01T00:00:00Z"


def tarinfo(name, kind, mode, size=0, linkname=""):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.linkname = linkname
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def busybox_layer(args):
    busybox = args.busybox
    # `busybox --list-full` prints each applet's install path, e.g. "bin/sh", "usr/bin/awk";
    # a busybox of another architecture is listed by the host's (same package, same applets).
    applets = subprocess.run(
        [args.applets_from or busybox, "--list-full"], check=True, capture_output=True, text=True
    ).stdout.split()
    with open(busybox, "rb") as f:
        binary = f.read()

    dirs = {"bin", "etc", "root", "tmp", "usr", "usr/bin", "usr/sbin", "sbin"}
    links = {}
    for path in applets:
        path = path.strip("/")
        if path == "bin/busybox" or not path:
            continue
        links[path] = "/bin/busybox"
        parent = os.path.dirname(path)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)

    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n"
        b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    }

    entries = []
    for d in dirs:
        mode = {"tmp": 0o1777, "root": 0o700}.get(d, 0o755)
        entries.append((d, tarinfo(d, tarfile.DIRTYPE, mode), None))
    entries.append(("bin/busybox", tarinfo("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), binary))
    for name, data in files.items():
        entries.append((name, tarinfo(name, tarfile.REGTYPE, 0o644, len(data)), data))
    for name, target in links.items():
        entries.append((name, tarinfo(name, tarfile.SYMTYPE, 0o777, linkname=target), None))
    entries.sort(key=lambda e: e[0])

    tmp = args.out + ".tmp"
    with open(tmp, "wb") as out:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for _, ti, data in entries:
                tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    os.replace(tmp, args.out)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def archive(args):
    diff_id = sha256_file(args.layer)
    container_config = {"Env": args.env}
    if args.cmd:
        container_config["Cmd"] = json.loads(args.cmd)
    config = {
        "architecture": args.arch,
        "config": container_config,
        "created": EPOCH,
        "history": [{"created": EPOCH, "created_by": args.created_by}],
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
    }
    if args.variant:
        config["variant"] = args.variant
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    repo, _, tag = args.tag.rpartition(":")
    manifest = [
        {
            "Config": config_id + ".json",
            "RepoTags": [args.tag],
            "Layers": [diff_id + "/layer.tar"],
        }
    ]
    repositories = {repo: {tag: config_id}}

    def small(name, data):
        return tarinfo(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data)

    tmp = args.out + ".tmp"
    with open(tmp, "wb") as out:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            tar.addfile(tarinfo(diff_id, tarfile.DIRTYPE, 0o755))
            size = os.path.getsize(args.layer)
            with open(args.layer, "rb") as layer:
                tar.addfile(tarinfo(diff_id + "/layer.tar", tarfile.REGTYPE, 0o644, size), layer)
            tar.addfile(*small(config_id + ".json", config_bytes))
            tar.addfile(*small("manifest.json", json.dumps(manifest, separators=(",", ":")).encode()))
            tar.addfile(*small("repositories", json.dumps(repositories, separators=(",", ":")).encode()))
    os.replace(tmp, args.out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser("busybox-layer")
    b.add_argument("--busybox", default="/bin/busybox")
    b.add_argument("--applets-from", default="", help="the busybox that lists the applets (default: --busybox)")
    b.add_argument("--out", required=True)
    a = sub.add_parser("archive")
    a.add_argument("--layer", required=True)
    a.add_argument("--tag", required=True)
    a.add_argument("--arch", required=True)
    a.add_argument("--variant", default="")
    a.add_argument("--cmd", default="")
    a.add_argument("--env", action="append", default=[])
    a.add_argument("--created-by", default="scripts/testbed")
    a.add_argument("--out", required=True)
    args = p.parse_args()
    {"busybox-layer": busybox_layer, "archive": archive}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
