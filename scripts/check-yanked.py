"""Fail if Cargo.lock pins a crates.io version that has been yanked (a yank is how crates.io
marks a broken or vulnerable release). Reads the sparse index at index.crates.io, which this
machine reaches; the RustSec advisory database (GitHub) it cannot, see deny.toml.
    python3 scripts/check-yanked.py [Cargo.lock ...]"""
import json, sys, tomllib, urllib.request
from concurrent.futures import ThreadPoolExecutor


def index_path(name):
    n = name.lower()
    if len(n) <= 2:
        return f"{len(n)}/{n}"
    if len(n) == 3:
        return f"3/{n[0]}/{n}"
    return f"{n[:2]}/{n[2:4]}/{n}"


def yanked(pkg):
    name, version = pkg
    with urllib.request.urlopen(f"https://index.crates.io/{index_path(name)}", timeout=20) as r:
        for line in r.read().decode().splitlines():
            v = json.loads(line)
            if v["vers"] == version:
                return name, version, v["yanked"]
    return name, version, None


locks = sys.argv[1:] or ["Cargo.lock"]
pkgs = set()
for lock in locks:
    with open(lock, "rb") as f:
        for p in tomllib.load(f).get("package", []):
            if p.get("source", "").startswith("registry+https://github.com/rust-lang/crates.io-index"):
                pkgs.add((p["name"], p["version"]))
with ThreadPoolExecutor(16) as ex:
    results = list(ex.map(yanked, sorted(pkgs)))
bad = [f"{n} {v}" for n, v, y in results if y]
missing = [f"{n} {v}" for n, v, y in results if y is None]
print(f"check-yanked: {len(results)} crates.io packages in {', '.join(locks)}: "
      f"{len(bad)} yanked, {len(missing)} not in the index")
for b in bad + missing:
    print(f"  {b}")
sys.exit(1 if bad or missing else 0)
