#!/usr/bin/env bash
# Benchmark, shipping at scale (issue 19), RUNS runs (default 3), each against the plain
# Docker way in the same run:
#   (a) COUNT (default 300) small assembled images (a 16 KiB file and an env value each, on a
#       base the nodes hold) to 4 nodes (Docker 26 and 28 on the containerd store, Docker
#       20.10, Docker 20.10 over ssh): `hallmark distribute` of them all at once, serial
#       and `--parallel`, against one `docker save` of all the tags piped into `docker load`,
#       node after node;
#   (b) `hallmark status` of those images on the 4 nodes against each node's own
#       `docker image inspect` of the tags (the slowest node's);
#   (c) the registry after the stream: a 32 MiB base reaches the 4 nodes by stream, then the
#       first `transport = "registry"` update (a 1 MiB layer on it, the registry's storage
#       empty): the bytes the nodes pulled, against the new layer's;
#   (d) a 64 MiB image to 8 nodes, `distribute` against `distribute --parallel`.
# Its own testbed of 8 nodes, or BENCH_TESTBED=DIR (one that is up; (d) then uses its nodes).
#
#   RUNS=3 COUNT=300 scripts/bench-scale.d/ship.sh      (HALLMARK_BIN: another binary)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
runs=${RUNS:-3}
count=${COUNT:-300}
# shellcheck source=scripts/lib/hallmark-bin
source "$repo/scripts/lib/hallmark-bin"
hallmark=$(hallmark_bin)
work=$(mktemp -d)
own=0
if [ -n "${BENCH_TESTBED:-}" ]; then
  dir=$BENCH_TESTBED
else
  dir=$work/testbed own=1
  scripts/testbed up --nodes 8 --dir "$dir" >/dev/null
fi
trap 'if [ "$own" = 1 ]; then "$repo/scripts/testbed" down --dir "$dir" >/dev/null 2>&1 || true; fi; rm -rf "$work"' EXIT
# shellcheck disable=SC1091
source "$dir/testbed.env"
export HALLMARK_CACHE=$work/cache
IFS=, read -r -a all_nodes <<<"$HMTB_NODES"
last=${all_nodes[-1]}
four=(node1 node2 node3 "$last")
config=$dir/hallmark.toml
python3 - "$config" "$work/four.toml" "${four[@]}" <<'PY'
import sys, re
text, out, keep = open(sys.argv[1]).read(), sys.argv[2], set(sys.argv[3:])
blocks = re.split(r"(?m)^(?=\[\[node\]\])", text)
kept = [b for b in blocks[1:] if re.search(r'name = "([^"]+)"', b).group(1) in keep]
open(out, "w").write(blocks[0] + "".join(kept))
PY
four_config=$work/four.toml
reg_config=$work/four-registry.toml
{ echo 'transport = "registry"'; cat "$four_config"; } >"$reg_config"

var() { local v="HMTB_${1^^}_$2"; echo "${!v:-}"; }
now() { date +%s%N; }
seconds() { python3 -c "print(f'{($2 - $1) / 1e9:.2f}')"; }
# The node's own docker: over ssh for the ssh node, its socket otherwise.
on_node() {
  local node=$1; shift
  if [ -n "$(var "$node" SSH_HOST)" ]; then ssh -F "$HMTB_SSH_CONFIG" "$(var "$node" SSH_HOST)" docker "$@"
  else docker -H "$(var "$node" LOCAL)" "$@"; fi
}
# CPU seconds the engines spent (the builder's and the four nodes' daemons, containerd and
# sshd included, with the children they waited for: docker-applyLayer, ssh sessions), from
# /proc: this machine's cores are shared by every node, so the least time any schedule of
# the four loads can take here is the CPU they need divided by the cores.
engine_pids=("$HMTB_BUILDER_PID")
for node in "${four[@]}"; do
  for key in PID CONTAINERD_PID SSHD_PID; do
    pid=$(var "$node" "$key"); [ -n "$pid" ] && engine_pids+=("$pid")
  done
done
ticks=$(getconf CLK_TCK) cores=$(nproc)
engine_cpu() {
  local sum=0 pid f
  for pid in "${engine_pids[@]}"; do
    read -r -a f <"/proc/$pid/stat"
    sum=$((sum + f[13] + f[14] + f[15] + f[16]))
  done
  echo "$sum"
}
cpu_seconds() { python3 -c "print(f'{($2 - $1) / $ticks:.2f}')"; }
forget() { # node tags...
  local node=$1; shift
  docker -H "$(var "$node" LOCAL)" rmi -f "$@" >/dev/null 2>&1 || true
}
# A containerd store removes the snapshots and blobs of removed images in the background
# (its garbage collection): wait until the engines are idle (under 5% of a core for a
# second, two minutes at most), so that no case is charged the cleanup of the one before.
settle() {
  local before after i
  for i in $(seq 120); do
    before=$(engine_cpu); sleep 1; after=$(engine_cpu)
    [ $((after - before)) -le $((ticks / 20)) ] && return
  done
  echo "settle: the engines did not go idle in 120 s" >&2
}

project=$work/project
mkdir -p "$project/images/base" "$project/pins"
touch "$project/hallmark.toml"
for image in base seedbase par; do cp pins/hello.toml "$project/pins/$image.toml"; done
printf '[image]\nname = "scale-base"\n[from]\nref = "hallmark-testbed/busybox:latest"\n[build]\nrun = ["echo scale > /scale.txt"]\n' \
  >"$project/images/base/image.toml"
tags=() names=()
for i in $(seq -f '%03g' 1 "$count"); do
  mkdir -p "$project/images/img$i/payload"
  head -c 16384 /dev/urandom >"$project/images/img$i/payload/file.bin"
  printf '[image]\nname = "scale-img%s"\n[from]\nimage = "base"\n[[file]]\nsrc = "payload"\ndest = "/opt/img%s"\n[env]\nSCALE = "%s"\n' \
    "$i" "$i" "$i" >"$project/images/img$i/image.toml"
  tags+=("scale-img$i:latest") names+=("img$i")
done
cd "$project"
t=$(now)
"$hallmark" -q --config "$four_config" build base "${names[@]}"
echo "built $count assembled images in $(seconds "$t" "$(now)") s" >&2
"$hallmark" -q --config "$config" distribute base >/dev/null

# (c)'s images, new each run: a base made by the engine, a 1 MiB layer assembled on it.
seed_images() { # run
  mkdir -p "$project/images/seedbase" "$project/images/seedwrap/payload"
  printf '[image]\nname = "scale-seedbase"\n[from]\nref = "hallmark-testbed/busybox:latest"\n[build]\nrun = ["echo %s > /run.txt && head -c 33554432 /dev/urandom > /seed.bin"]\n' \
    "$1-$RANDOM" >"$project/images/seedbase/image.toml"
  head -c 1048576 /dev/urandom >"$project/images/seedwrap/payload/new.bin"
  printf '[image]\nname = "scale-seedwrap"\n[from]\nimage = "seedbase"\n[[file]]\nsrc = "payload"\ndest = "/opt/new"\n' \
    >"$project/images/seedwrap/image.toml"
  "$hallmark" -q --config "$four_config" build seedwrap
}
mkdir -p "$project/images/par"
printf '[image]\nname = "scale-par"\n[from]\nref = "hallmark-testbed/busybox:latest"\n[build]\nrun = ["head -c 67108864 /dev/urandom > /par.bin"]\n' \
  >"$project/images/par/image.toml"
"$hallmark" -q --config "$config" build par

json_sum() { # file key: the sum of key over every node row of a distribute report
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(n[sys.argv[2]] for i in d["images"] for n in i["nodes"]))' "$1" "$2"
}
failed_rows() {
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(not n["verified"] for i in d["images"] for n in i["nodes"]))' "$1"
}

results=$work/results
: >"$results"
for run in $(seq 1 "$runs"); do
  # (a) baseline first, then hallmark (which leaves the nodes holding its images for (b)).
  for node in "${four[@]}"; do forget "$node" "${tags[@]}"; done
  settle
  t=$(now) c=$(engine_cpu)
  for node in "${four[@]}"; do
    docker -H "$HMTB_BUILDER" save "${tags[@]}" | on_node "$node" load -q >/dev/null
  done
  a_d=$(seconds "$t" "$(now)") a_d_cpu=$(cpu_seconds "$c" "$(engine_cpu)")
  a() { # flags...: hallmark's seconds, then the CPU seconds of the engines and of hallmark
    for node in "${four[@]}"; do forget "$node" "${tags[@]}"; done
    settle
    local t0 c0; t0=$(now) c0=$(engine_cpu)
    /usr/bin/time -f '%U %S' -o "$work/a.time" \
      "$hallmark" --json --config "$four_config" distribute "${names[@]}" "$@" >"$work/a.json" || true
    echo "$(seconds "$t0" "$(now)") $(cpu_seconds "$c0" "$(engine_cpu)") $(awk '{print $1 + $2}' "$work/a.time")"
    [ "$(failed_rows "$work/a.json")" = 0 ] || echo "run $run (a): $(failed_rows "$work/a.json") rows not verified" >&2
  }
  read -r a_h a_h_cpu a_h_own <<<"$(a)"
  read -r a_p a_p_cpu a_p_own <<<"$(a --parallel)"

  # (b) status against each node's own inspect of the tags (the slowest node).
  t=$(now)
  "$hallmark" --json --config "$four_config" status >"$work/b.json"
  b_h=$(seconds "$t" "$(now)")
  python3 -c 'import json,sys; rows=json.load(open(sys.argv[1]))["holdings"]; bad=[r for r in rows if r["image"].startswith("img") and r["state"]!="current"]; print(f"run {sys.argv[2]} (b): {len(bad)} rows not current", file=sys.stderr) if bad else None' "$work/b.json" "$run"
  b_d=0
  for node in "${four[@]}"; do
    t=$(now)
    on_node "$node" image inspect "${tags[@]}" >/dev/null
    b_d=$(python3 -c "print(max($b_d, ($(now) - $t) / 1e9))")
  done

  # (c) the registry's first update after the base reached the nodes by stream.
  seed_images "$run"
  "$hallmark" -q --config "$four_config" distribute seedbase
  rm -rf "$HALLMARK_CACHE/registry"
  new_layer=$(docker -H "$HMTB_BUILDER" image inspect scale-seedwrap --format '{{.Size}}')
  base_size=$(docker -H "$HMTB_BUILDER" image inspect scale-seedbase --format '{{.Size}}')
  t=$(now)
  "$hallmark" --json --config "$reg_config" distribute seedwrap >"$work/c.json" || true
  c_h=$(seconds "$t" "$(now)")
  c_bytes=$(json_sum "$work/c.json" layer_bytes)
  new_layer=$((new_layer - base_size))

  # (d) 8 nodes (or the testbed's), serial and --parallel, in alternating order.
  d() { # flags...
    for node in "${all_nodes[@]}"; do forget "$node" scale-par:latest; done
    local t0; t0=$(now)
    "$hallmark" -q --config "$config" distribute par "$@"
    seconds "$t0" "$(now)"
  }
  if [ $((run % 2)) = 1 ]; then d_s=$(d); d_p=$(d --parallel); else d_p=$(d --parallel); d_s=$(d); fi
  # Each run's row on stderr too, so that a run cut short still leaves the earlier rows.
  echo "$run $a_h $a_p $a_d $b_h $b_d $c_h $c_bytes $new_layer $d_s $d_p $a_d_cpu $a_h_cpu $a_h_own $a_p_cpu $a_p_own" | tee -a "$results" >&2
done

python3 - "$results" "$count" "${#all_nodes[@]}" "$cores" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
count, nodes, cores = sys.argv[2], sys.argv[3], int(sys.argv[4])
mib = lambda b: f"{int(b) / 2**20:.2f}"
print(f"\n(a) {count} images to 4 nodes, (b) status of them on 4 nodes, (c) first registry update after the stream (4 nodes), (d) 64 MiB image to {nodes} nodes\n")
print("| run | (a) hallmark s | (a) --parallel s | (a) save\\|load s | (a) x faster (serial, --parallel) | (b) status s | (b) slowest inspect s | (b) status/inspect | (c) s | (c) pulled MiB | (c) new layer MiB x4 | (d) serial s | (d) --parallel s | (d) serial/parallel |")
print("|---|" + "---|" * 13)
for r, ah, ap, ad, bh, bd, ch, cb, nl, ds, dp, *_ in rows:
    print(f"| {r} | {ah} | {ap} | {ad} | {float(ad)/float(ah):.2f}, {float(ad)/float(ap):.2f} | {bh} | {float(bd):.2f} | {float(bh)/float(bd):.2f} | {ch} | {mib(cb)} | {mib(4*int(nl))} | {ds} | {dp} | {float(ds)/float(dp):.2f} |")
print(f"\n(a) where the time goes: CPU seconds of the engines (builder and nodes, with their children) and of hallmark; on this machine's {cores} cores no schedule of the loads can take less than their CPU / {cores}\n")
print("| run | save\\|load: engines CPU s | hallmark serial: engines CPU s | hallmark CPU s | --parallel: engines CPU s | hallmark CPU s | --parallel s | least possible here s | save\\|load s / least possible |")
print("|---|" + "---|" * 8)
for r, ah, ap, ad, *rest in rows:
    dcpu, hcpu, hown, pcpu, pown = map(float, rest[7:])
    least = (pcpu + pown) / cores
    print(f"| {r} | {dcpu:.1f} | {hcpu:.1f} | {hown:.1f} | {pcpu:.1f} | {pown:.1f} | {ap} | {least:.1f} | {float(ad)/least:.2f}x |")
PY
reproduce "RUNS=$runs COUNT=$count scripts/bench-scale.d/ship.sh"
