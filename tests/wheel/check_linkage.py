"""Every library the installed wheel's binaries load comes from the wheel, or is one a manylinux system
guarantees (the policy's list, read from auditwheel itself), and libcurl and libzstd come from the
wheel.

    python check_linkage.py SITE_PACKAGES POLICY

Run with the Python that has auditwheel (scripts/build_wheel.sh's tool environment). It resolves
each binary's dependencies with ldd in an empty environment (no LD_LIBRARY_PATH): the draftfeed
program (draftfeed/_bin/draftfeed) and the Python module (draftfeed/_core*.so). A library found
only on this machine (e.g. /usr/lib/.../libcurl.so.4 if the wheel did not bundle it), or not found
at all, fails the check. Prints each binary's libraries by kind.
"""

from __future__ import annotations

import glob
import importlib.resources
import json
import os
import re
import subprocess
import sys

# ldd lines: "libx.so.1 => /path/libx.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)",
# "linux-vdso.so.1 (0x...)", "libx.so.1 => not found".
LINE = re.compile(r"^\s*(\S+)(?: => (.+?))?(?: \(0x[0-9a-f]+\))?$")
LOADER_OR_VDSO = re.compile(r"^(linux-vdso|ld-linux)")
NOT_FOUND, NOT_BUNDLED = "NOT FOUND", "FROM THIS MACHINE, NOT BUNDLED"
# What no manylinux system guarantees and both binaries link: the online client and the pack codec.
MUST_BUNDLE = ("libcurl", "libzstd")


def policy_libraries(policy: str) -> set[str]:
    text = importlib.resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text()
    for entry in json.loads(text):
        if entry["name"] == policy or policy in entry.get("aliases", []):
            return set(entry["lib_whitelist"])
    raise SystemExit(f"auditwheel knows no policy {policy}")


def dependencies(binary: str) -> list[tuple[str, str | None]]:
    result = subprocess.run(["ldd", binary], env={}, capture_output=True, text=True, check=True)
    found = []
    for line in result.stdout.splitlines():
        match = LINE.match(line)
        if match is None:
            raise SystemExit(f"cannot read ldd's line for {binary}: {line!r}")
        name, where = match.group(1), match.group(2)
        found.append((name, None if where == "not found" else where or name))
    return found


def main() -> None:
    site, policy = sys.argv[1], sys.argv[2]
    allowed = policy_libraries(policy)
    bundled = os.path.join(site, "draftfeed.libs")
    binaries = [os.path.join(site, "draftfeed", "_bin", "draftfeed"),
                *glob.glob(os.path.join(site, "draftfeed", "_core*.so"))]
    failures = []
    for binary in binaries:
        if not os.path.isfile(binary):
            failures.append(f"{binary}: missing from the installed wheel")
            continue
        kinds: dict[str, list[str]] = {}
        for name, where in dependencies(binary):
            if where is None:
                verdict = NOT_FOUND
            elif os.path.dirname(os.path.normpath(where)) == bundled:
                verdict = "bundled"
            elif LOADER_OR_VDSO.match(os.path.basename(name)) or name in allowed:
                verdict = "system (manylinux policy)"
            else:
                verdict = NOT_BUNDLED
            kinds.setdefault(verdict, []).append(name if verdict == "bundled" else f"{name} -> {where}")
            if verdict in (NOT_FOUND, NOT_BUNDLED):
                failures.append(f"{os.path.relpath(binary, site)}: {name} -> {where}: {verdict.lower()}")
        print(f"{os.path.relpath(binary, site)}:")
        for verdict, names in kinds.items():
            print(f"  {verdict} ({len(names)}): {', '.join(names)}")
        for library in MUST_BUNDLE:
            if not any(name.startswith(library) for name in kinds.get("bundled", [])):
                failures.append(f"{os.path.relpath(binary, site)}: no {library} from {bundled}")
    if failures:
        print("linkage check FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print(f"linkage check: {len(binaries)} binaries load only bundled libraries and {policy}'s "
          f"system libraries")


if __name__ == "__main__":
    main()
