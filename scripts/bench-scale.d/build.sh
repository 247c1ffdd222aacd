#!/usr/bin/env bash
# Benchmark (part of scripts/bench-scale; runs on its own too): building and normalising a
# 2 GiB engine-built image against plain Docker on the same builder, in the same run:
#   - `hallmark build --force` of the 2 GiB image vs `docker build --no-cache` of its
#     rendered context;
#   - its normalisation alone vs a plain `docker save` of the same image, and a plain
#     `docker load` of that save (after the image is removed): normalisation must load the
#     rewritten layer into the builder, so that load is part of its floor;
#   - a 16 MiB layer built on that 2 GiB image, normalised, vs a `docker save` of the result;
#   - the layer store's disk use after the builds vs the image's layers (all of them, and
#     those built on the external base, which a build never writes into the store).
# The 2 GiB are seeded pseudo-random bytes (incompressible, the same in every build), so a
# rebuild gives the same normalised layer and the store's size says whether it keeps copies.
#
#   scripts/bench-scale.d/build.sh [RUNS]     (default 3)
#   BENCH_TESTBED=DIR uses a running testbed (else one is started and stopped);
#   HALLMARK_BIN=PATH uses that binary instead of a release build; BENCH_MIB=N sizes the
#   big image (default 2048).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
runs=${1:-3}
mib=${BENCH_MIB:-2048}

# shellcheck source=scripts/lib/hallmark-bin
source "$repo/scripts/lib/hallmark-bin"
hallmark=$(hallmark_bin)
work=$(mktemp -d)
tag=$(basename "$work" | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9')
if [[ -n ${BENCH_TESTBED:-} ]]; then
  dir=$BENCH_TESTBED
  # Its own images go, and then with `hallmark prune` the build cache their builds left.
  trap 'docker -H "$builder" rmi -f bench-scale-docker:latest "bench-scale-small-$tag:latest" "bench-scale-big-$tag:latest" >/dev/null 2>&1 || true; (cd "$project" && "$hallmark" -q --config "$config" prune) >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
else
  dir=$work/testbed
  scripts/testbed up --nodes 1 --dir "$dir" >/dev/null
  trap '"$repo/scripts/testbed" down --dir "$dir" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
fi
builder=$(grep -m1 '^HMTB_BUILDER=' "$dir/testbed.env" | cut -d= -f2-)
engine=$(grep -m1 '^HMTB_BUILDER_VERSION=' "$dir/testbed.env" | cut -d= -f2-)
store_kind=$(grep -m1 '^HMTB_BUILDER_STORE=' "$dir/testbed.env" | cut -d= -f2-)
config=$dir/hallmark.toml
export HALLMARK_CACHE=$work/cache

project=$work/project
mkdir -p "$project/images/big" "$project/images/small" "$project/pins"
touch "$project/hallmark.toml"   # marks the project root
cat > "$project/images/big/image.toml" <<TOML
[image]
name = "bench-scale-big-$tag"
[from]
ref = "hallmark-testbed/python:bookworm"
[build]
run = ["python3 -c 'import random,sys; r=random.Random(1); [sys.stdout.buffer.write(r.randbytes(1<<20)) for _ in range($mib)]' > /big.bin"]
TOML
cat > "$project/images/small/image.toml" <<TOML
[image]
name = "bench-scale-small-$tag"
[from]
image = "big"
[build]
run = ["head -c 16777216 /dev/urandom > /small.bin"]
TOML
cd "$project"
"$hallmark" -q --config "$config" lock big >/dev/null
"$hallmark" -q render big --out "$work/ctx" >/dev/null

now() { date +%s%N; }
secs() { echo "scale=3; ($2 - $1) / 1000000000" | bc; }
record() { python3 -c 'import json,sys; r=json.load(sys.stdin)["records"][-1]; print(r["seconds"], r.get("normalize_seconds") or 0)'; }
# The bytes of an image's layers as `docker save` writes them (uncompressed tars).
layer_bytes() {
  docker -H "$builder" save "$1" | python3 -c '
import json, sys, tarfile
sizes, manifest = {}, None
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
    for m in t:
        if m.isfile():
            sizes[m.name] = m.size
            if m.name == "manifest.json":
                manifest = json.load(t.extractfile(m))
print(sum(sizes[p] for p in manifest[0]["Layers"]))'
}
store_bytes() { du -sb --exclude=tmp "$HALLMARK_CACHE/store" | cut -f1; }

base_bytes=$(layer_bytes hallmark-testbed/python:bookworm)
echo "run,hallmark_build,docker_build,normalise_big,save_big,load_big,normalise_small,save_small,store,layers,base,load" > "$work/rows"
for run in $(seq "$runs"); do
  # Each run's images go first: the builder then lacks their layers, as for a build of new
  # content (a forced rebuild of the same bytes finds its normalised layer already loaded,
  # and the engine skips unpacking it again: faster than a real build would be).
  docker -H "$builder" rmi -f "bench-scale-small-$tag:latest" "bench-scale-big-$tag:latest" >/dev/null 2>&1 || true
  t0=$(now); big=$("$hallmark" --json --config "$config" build --force big 2>>"$work/log" | record); t1=$(now)
  hb=$(secs "$t0" "$t1"); nb=${big#* }
  t0=$(now); DOCKER_BUILDKIT=0 docker -H "$builder" build -q --no-cache -t bench-scale-docker:latest "$work/ctx" >/dev/null 2>>"$work/log"; t1=$(now)
  db=$(secs "$t0" "$t1")
  docker -H "$builder" rmi -f bench-scale-docker:latest >/dev/null
  t0=$(now); docker -H "$builder" save "bench-scale-big-$tag:latest" >/dev/null; t1=$(now)
  sb=$(secs "$t0" "$t1")
  small=$("$hallmark" --json --config "$config" build --force small 2>>"$work/log" | record); ns=${small#* }
  t0=$(now); docker -H "$builder" save "bench-scale-small-$tag:latest" >/dev/null; t1=$(now)
  ss=$(secs "$t0" "$t1")
  store_now=$(store_bytes) layers_now=$(layer_bytes "bench-scale-small-$tag:latest")
  # The load floor: the big image saved to a file, removed (the small one too), loaded again.
  docker -H "$builder" save -o "$work/big.tar" "bench-scale-big-$tag:latest"
  docker -H "$builder" rmi "bench-scale-small-$tag:latest" "bench-scale-big-$tag:latest" >/dev/null
  t0=$(now); docker -H "$builder" load -q -i "$work/big.tar" >/dev/null; t1=$(now)
  lb=$(secs "$t0" "$t1")
  rm -f "$work/big.tar"
  echo "$run,$hb,$db,$nb,$sb,$lb,$ns,$ss,$store_now,$layers_now,$base_bytes,$(cut -d' ' -f1 /proc/loadavg)" >> "$work/rows"
  # The engine's build cache of the superseded forced builds (the raw images' parents, which
  # hallmark leaves as the next build's cache) goes: 2 GiB and more a run, which filled this
  # machine's disk after a few benches before `prune` removed it.
  "$hallmark" --config "$config" prune 2>>"$work/log" >/dev/null
  echo "build.sh: run $run of $runs: $(tail -1 "$work/rows")" >&2
done

python3 - "$work/rows" "$mib" "$engine" "$store_kind" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
mib, engine, kind = sys.argv[2:5]
print(f"{mib} MiB engine-built image + a 16 MiB layer on it; builder Docker {engine} ({kind} store); seconds, ratio = hallmark / plain Docker in the same run\n")
print("| run | build --force | docker build --no-cache | ratio | normalise | docker save | ratio | docker load | normalise / (save + load) | 16 MiB on it: normalise | docker save | ratio | store | image's layers (built on the base) | ratio | load avg |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
f = lambda k, r: float(r[k])
for r in rows:
    hb, db, nb, sb, lb, ns, ss = (f(k, r) for k in ("hallmark_build", "docker_build", "normalise_big", "save_big", "load_big", "normalise_small", "save_small"))
    st, ly, base = int(r["store"]), int(r["layers"]), int(r["base"])
    print(f"| {r['run']} | {hb:.1f} | {db:.1f} | {hb/db:.2f}x | {nb:.1f} | {sb:.1f} | {nb/sb:.2f}x | {lb:.1f} | {nb/(sb+lb):.2f}x | {ns:.1f} | {ss:.1f} | {ns/ss:.2f}x | {st/2**20:.0f} MiB | {ly/2**20:.0f} MiB ({(ly-base)/2**20:.0f}) | {st/ly:.3f}x ({st/(ly-base):.3f}x) | {r['load']} |")
print("\ntargets (issue 19): build <= 1.3x, normalise <= 1.2x, 16 MiB on it <= 1.0x, store <= 1.05x the image's layers")
PY
reproduce "BENCH_MIB=$mib scripts/bench-scale.d/build.sh $runs"
