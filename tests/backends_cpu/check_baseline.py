#!/usr/bin/env python3
# check_baseline.py PLUGIN.so — the cpu plugin loads and runs on any x86-64: no function outside the per-ISA
# code (namespaces dew::cpu::avx512 / avx2 and the *_avx512 / *_avx2 clones, isa_clones.hpp) holds an
# AVX / AVX-512 instruction (a ymm / zmm / mask register or an FMA). The allowed exceptions are matmul.cpp's
# to_bf16_range and attention_bf16.cpp's kernels (namespace dew::cpu::avx512bf16), target("avx512bf16") code called
# only after the CPU was checked for AVX512-BF16.
# Exit 0 when clean; 1 listing the offending functions.
import re
import subprocess
import sys

ALLOWED = ("::avx512::", "::avx2::", "_avx512(", "_avx2(", "::to_bf16_range(", "::avx512bf16::")
dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", sys.argv[1]], capture_output=True, text=True,
                     check=True).stdout
current, wide, functions = None, set(), 0
for line in dis.splitlines():
    m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
    if m:
        current = m.group(1)
        functions += 1
        continue
    if current and re.search(r"%[yz]mm\d|%k[0-7]\b|\tvfn?m(add|sub)", line):
        wide.add(current)
bad = sorted(f for f in wide if not any(a in f.replace("(anonymous namespace)", "").split("(")[0] + "(" for a in ALLOWED))
per_isa = len(wide) - len(bad)
if bad:
    print(f"{len(bad)} function(s) outside the per-ISA code use AVX/AVX-512 instructions:")
    for f in bad[:20]:
        print("  " + f[:200])
    sys.exit(1)
if per_isa == 0:
    print("no AVX code at all: the per-ISA paths are missing")
    sys.exit(1)
print(f"baseline clean: {functions} functions, {per_isa} with AVX/AVX-512 code, all in the per-ISA paths")
