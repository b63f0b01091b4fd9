#!/usr/bin/env python3
"""tests/harness/every_case_registered.py BIN_DIR BUILD_DIR CTEST — fails when a doctest case would not run.

For each doctest binary in BIN_DIR (test_*, recognised by doctest's own strings) the cases it lists
(--list-test-cases) must each be a CTest test of BUILD_DIR (`ctest -N`), under its name or a dotted prefix
(doctest_discover_tests' TEST_PREFIX, e.g. `data.`). A case missing there is one `ctest` never runs: CMake
splits names at `;`, so such a name registers a filter that matches no case, and that test passes empty.
"""
import os
import re
import subprocess
import sys

bin_dir, build_dir, ctest = sys.argv[1:4]
listing = subprocess.run([ctest, "-N"], cwd=build_dir, capture_output=True, text=True, check=True).stdout
registered = set(m.group(1) for m in re.finditer(r"^\s*Test\s+#\d+: (.*)$", listing, re.M))
if not registered:
    sys.exit("every_case_registered: `ctest -N` listed no tests in " + build_dir)

missing, binaries, cases = [], 0, 0
for name in sorted(os.listdir(bin_dir)):
    path = os.path.join(bin_dir, name)
    if not (name.startswith("test_") and os.access(path, os.X_OK) and os.path.isfile(path)):
        continue
    with open(path, "rb") as f:
        if b"--list-test-cases" not in f.read():  # not a doctest binary (an MPI program, ...)
            continue
    out = subprocess.run([path, "--list-test-cases", "--no-version"], capture_output=True, text=True,
                         timeout=60)
    if out.returncode == 77:  # skips itself here (the GPU tests without a GPU): CTest runs it whole
        continue
    if out.returncode != 0:
        missing.append(f"{name}: --list-test-cases failed ({out.returncode}): {out.stderr.strip()[:200]}")
        continue
    binaries += 1
    for line in out.stdout.splitlines():
        case = line.rstrip("\n")
        if not case or case.startswith("[doctest]") or set(case) == {"="}:
            continue
        cases += 1
        if case in registered or any(r.endswith(case) and re.fullmatch(r"[\w.-]+\.", r[: -len(case)])
                                     for r in registered):
            continue
        why = " (a `;` in the name: CMake cuts it there)" if ";" in case else ""
        missing.append(f"{name}: {case!r}{why}")

print(f"every_case_registered: {cases} cases in {binaries} doctest binaries, {len(registered)} CTest tests")
if missing:
    print(f"{len(missing)} case(s) that ctest would never run:")
    for m in missing:
        print("  " + m)
    sys.exit(1)
