#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Checks the layering that docs/HACKING.md ("Layers") describes, as the build enforces it.

For every source file of a lower layer, from the build's own compile_commands.json: the include folders
of the tree on its compiler line are only its own layer's and those below it. And from the sources:
every quoted #include of a lower-layer file names a file that exists in one of those folders, so that
an include reaching up (a leaf including a daemon header) is named here, with the fix, before the
compiler's "No such file" is."""
import json
import os
import re
import sys

SRC = os.environ["GNA_SOURCE_ROOT"]
BUILD = os.environ["GNA_BUILD_ROOT"]

# layer folder -> the folders of the tree its files may include from.
LAYERS = {
    "agent/basic": ["agent/basic"],
    "modules": ["modules", "agent/basic"],
    "labels": ["labels", "agent/basic"],
}

failures = []


def layer_of(rel):
    for layer in LAYERS:
        if os.path.dirname(rel) == layer:
            return layer
    return None


def check_compile_commands():
    with open(os.path.join(BUILD, "compile_commands.json")) as f:
        commands = json.load(f)
    seen = set()
    for c in commands:
        src = os.path.relpath(os.path.normpath(os.path.join(c["directory"], c["file"])), SRC)
        layer = layer_of(src)
        if layer is None:
            continue
        seen.add(layer)
        args = c.get("arguments") or c["command"].split()
        for i, a in enumerate(args):
            if a == "-I":
                a = "-I" + args[i + 1]
            if not a.startswith("-I"):
                continue
            d = os.path.normpath(os.path.join(c["directory"], a[2:]))
            rel = os.path.relpath(d, SRC)
            if rel.startswith("..") or rel == ".":
                continue  # system or build folders (generated headers)
            if not os.path.relpath(d, BUILD).startswith(".."):
                continue
            if rel not in LAYERS[layer]:
                failures.append(f"{src} is compiled with -I{rel}, above its layer {layer}/: only "
                                f"{', '.join(LAYERS[layer])} may be on its include path (meson.build)")
    for layer in LAYERS:
        if layer not in seen:
            failures.append(f"no source of {layer}/ in compile_commands.json: is it still built?")


def check_includes():
    for layer, allowed in LAYERS.items():
        for name in sorted(os.listdir(os.path.join(SRC, layer))):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(SRC, layer, name)
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc == "build-config.h":
                        failures.append(f"{layer}/{name}:{n} includes build-config.h, the daemon's; pass what it needs in")
                        continue
                    if not any(os.path.exists(os.path.join(SRC, d, inc)) for d in allowed):
                        failures.append(f"{layer}/{name}:{n} includes \"{inc}\", which is not in "
                                        f"{', '.join(d + '/' for d in allowed)}: a lower layer may not include "
                                        f"a higher one's header (docs/HACKING.md, \"Layers\")")


check_compile_commands()
check_includes()
for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print(f"ok: {', '.join(LAYERS)} include only their own layer and those below")
