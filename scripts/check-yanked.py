"""Fail if Cargo.lock pins a crates.io version that has been yanked (a yank is how crates.io
marks a broken or vulnerable release). Reads the sparse index at index.crates.io, which this
machine reaches; the RustSec advisory database (GitHub) it cannot, see deny.toml.

A lookup that fails (the network or its DNS hiccups) is retried with backoff, then answered
from cargo's own copy of the index entry (~/.cargo/registry/index/*/.cache), which cargo wrote
when it last resolved that crate. A package neither can answer is reported as NOT CHECKED
(said plainly, like the advisories in scripts/deny.sh) rather than failing the build on the
network; a yanked version or one the index does not list fails it.
    python3 scripts/check-yanked.py [Cargo.lock ...]"""
import glob, json, os, sys, threading, time, tomllib, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor

TRIES = 4
# Set once one lookup has failed every try: the rest go straight to cargo's cache.
UNREACHABLE = threading.Event()


def index_path(name):
    n = name.lower()
    if len(n) <= 2:
        return f"{len(n)}/{n}"
    if len(n) == 3:
        return f"3/{n[0]}/{n}"
    return f"{n[:2]}/{n[2:4]}/{n}"


def from_index(name, version):
    """(yanked or None if the version is not listed), or raises OSError when unreachable."""
    url = f"https://index.crates.io/{index_path(name)}"
    if UNREACHABLE.is_set():
        raise OSError("index.crates.io unreachable")
    for attempt in range(TRIES):
        try:
            with urllib.request.urlopen(url, timeout=20) as r:
                lines = r.read().decode().splitlines()
            break
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            err = e
        except OSError as e:  # URLError, timeouts, resets
            err = e
        if attempt + 1 < TRIES:
            time.sleep(2**attempt)
    else:
        UNREACHABLE.set()
        raise OSError(f"{url}: {err}")
    for line in lines:
        v = json.loads(line)
        if v["vers"] == version:
            return v["yanked"]
    return None


def cargo_home():
    return os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")


def from_cargo_cache(name, version):
    """cargo's cache file: a version byte, a u32 index version, the index revision, then
    NUL-terminated (version, JSON) pairs. Returns yanked, or raises LookupError."""
    for path in glob.glob(os.path.join(cargo_home(), "registry/index/index.crates.io-*/.cache",
                                       index_path(name))):
        with open(path, "rb") as f:
            data = f.read()
        parts = data[5:].split(b"\0")[1:]  # [5:]: header; [1:]: the revision
        for vers, entry in zip(parts[0::2], parts[1::2]):
            if vers.decode(errors="replace") == version:
                return json.loads(entry)["yanked"]
    raise LookupError


def check(pkg):
    name, version = pkg
    try:
        return name, version, from_index(name, version), "index"
    except OSError as e:
        net_err = e
    try:
        return name, version, from_cargo_cache(name, version), "cargo-cache"
    except (LookupError, OSError, ValueError, KeyError):
        return name, version, None, f"unchecked ({net_err})"


locks = sys.argv[1:] or ["Cargo.lock"]
pkgs = set()
for lock in locks:
    with open(lock, "rb") as f:
        for p in tomllib.load(f).get("package", []):
            if p.get("source", "").startswith("registry+https://github.com/rust-lang/crates.io-index"):
                pkgs.add((p["name"], p["version"]))
with ThreadPoolExecutor(16) as ex:
    results = list(ex.map(check, sorted(pkgs)))
bad = [f"{n} {v}" for n, v, y, _ in results if y]
missing = [f"{n} {v}" for n, v, y, src in results if y is None and src == "index"]
cached = [f"{n} {v}" for n, v, _, src in results if src == "cargo-cache"]
unchecked = [f"{n} {v}: {src}" for n, v, _, src in results if src.startswith("unchecked")]
print(f"check-yanked: {len(results)} crates.io packages in {', '.join(locks)}: "
      f"{len(bad)} yanked, {len(missing)} not in the index, "
      f"{len(cached)} answered from cargo's cached index (index.crates.io unreachable)")
for b in bad + missing:
    print(f"  {b}")
if unchecked:
    print(f"check-yanked: {len(unchecked)} packages NOT CHECKED (neither index.crates.io nor "
          f"cargo's cache could answer):", file=sys.stderr)
    for u in unchecked[:10]:
        print(f"  {u}", file=sys.stderr)
sys.exit(1 if bad or missing else 0)
