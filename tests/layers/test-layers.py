#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Checks the layering that docs/HACKING.md ("Layers") describes, as the build enforces it.

For every source file of a lower layer, from the build's own compile_commands.json: the include folders
of the tree on its compiler line are only its own layer's and those below it. And from the sources:
every quoted #include of a lower-layer file names a file that exists in one of those folders, so that
an include reaching up (a leaf including a daemon header) is named here, with the fix, before the
compiler's "No such file" is.

And within agent/: no include cycle across subsystems (bus, manager, stage, health, mig, nvml, cdi, ctl,
config, …; a file's subsystem is its folder under agent/, else the first word of its name, with devices.h
and driver.h, the headers of stage-devices.c and stage-driver.c, in stage). The graph has an arrow from a
file to each header it includes and from a header to each file that defines a function it declares (so
that a header stands for the code behind it); a strongly connected part of it with files of more than
one subsystem is such a cycle, and is named with the arrows of one round trip. None is tolerated: the
code below the manager sees node.h and asks the manager through NodeOps. Only the manager's own files
and main.c include manager.h (the bus layer: manager-bus.h), only the bus layer, main.c and gpunodectl
bus.h.

And every event source has a description: timers through agent/basic/event-util.c, the others with
sd_event_source_set_description()."""
import collections
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


AGENT_FOLDERS = {"basic", "cdi", "ctl", "mig", "nvml"}


def subsystem(rel):
    if "/" in rel and rel.split("/")[0] in AGENT_FOLDERS:
        return rel.split("/")[0]
    stem = os.path.basename(rel)[:-2]
    if stem in ("devices", "driver"):
        return "stage"
    return re.split(r"[-.]", stem)[0]


# Headers of agent/ that only some files may include (docs/HACKING.md, "Layers"): the Manager's full
# definition is the manager's own (and main.c's); the bus layer sees it through manager-bus.h; nothing
# but the bus layer, main.c and gpunodectl includes the bus's headers.
RESTRICTED = {
    "manager.h": ("the manager's own files and main.c", lambda rel: re.match(r"manager[-.]", rel) or rel == "main.c",
                  "; the bus layer includes manager-bus.h, the code below the manager node.h"),
    "bus.h": ("the bus layer, main.c and gpunodectl", lambda rel: rel.startswith(("bus-", "bus.", "ctl/")) or rel == "main.c",
              "; below the bus, tell D-Bus what changed with node_mark_dirty() and the like (node.h)"),
    "bus-mig.h": ("the bus layer", lambda rel: rel.startswith(("bus-", "bus.")), ""),
}


def check_restricted(files):
    for rel, text in sorted(files.items()):
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m and m.group(1) in RESTRICTED:
                who, allowed, hint = RESTRICTED[m.group(1)]
                if not allowed(rel):
                    failures.append(f"agent/{rel}:{n} includes {m.group(1)}: only {who} may{hint} "
                                    f"(docs/HACKING.md, \"Layers\")")


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def agent_graph():
    root = os.path.join(SRC, "agent")
    files = {}
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith((".c", ".h")):
                rel = os.path.relpath(os.path.join(d, n), root)
                with open(os.path.join(d, n)) as f:
                    files[rel] = f.read()
    by_name = collections.defaultdict(list)
    for rel in files:
        by_name[os.path.basename(rel)].append(rel)
    declared = collections.defaultdict(set)
    for rel, text in files.items():
        if rel.endswith(".h"):
            for m in re.finditer(r"^[A-Za-z_][^;{}()#]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)[^;{}()]*(?:\([^;{}]*\)[^;{}()]*)*;",
                                 strip_comments(text), re.M):
                declared[m.group(1)].add(rel)
    edges = {rel: {} for rel in files}
    for rel, text in files.items():
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                for h in by_name.get(os.path.basename(m.group(1)), []):
                    edges[rel].setdefault(h, f"agent/{rel}:{n} includes {m.group(1)}")
        if rel.endswith(".c"):
            for m in re.finditer(r"^(?!static\b)[A-Za-z_][^;{}()#=]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{",
                                 strip_comments(text), re.M):
                for h in declared.get(m.group(1), ()):
                    if h != rel:
                        edges[h].setdefault(rel, f"agent/{h} is implemented by agent/{rel} ({m.group(1)}())")
    return files, edges


def strongly_connected(nodes, edges):
    index, low, on, stack, out = {}, {}, set(), [], []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def path(edges, inside, a, b):
    prev = {a: None}
    queue = collections.deque([a])
    while queue:
        v = queue.popleft()
        if v == b:
            break
        for w in sorted(edges[v]):
            if w in inside and w not in prev:
                prev[w] = v
                queue.append(w)
    steps = []
    while prev[b] is not None:
        steps.append(edges[prev[b]][b])
        b = prev[b]
    return steps[::-1]


def check_agent_cycles():
    files, edges = agent_graph()
    check_restricted(files)
    for comp in strongly_connected(files, edges):
        subs = {subsystem(f) for f in comp}
        if len(subs) < 2:
            continue
        inside = set(comp)
        a = comp[0]
        trip = min((path(edges, inside, a, b) + path(edges, inside, b, a)
                    for b in comp if subsystem(b) != subsystem(a)), key=len)
        failures.append(f"include cycle across the subsystems {', '.join(sorted(subs))} of agent/ "
                        f"({len(comp)} files). One round trip: " + "; ".join(trip) + ". Break it: the code below "
                        f"the manager sees node.h and asks the manager through NodeOps; where two subsystems call "
                        f"each other, move the shared state into the Node or hand over a callback "
                        f"(docs/HACKING.md, \"Layers\")")


def check_event_sources():
    """Every event source of ours has a description (issue 8, item 5): timers are added through
    agent/basic/event-util.c, which names them; any other sd_event_add_*() is followed, in its file, by
    sd_event_source_set_description() on the same source."""
    for d, _, names in os.walk(SRC):
        rel_d = os.path.relpath(d, SRC)
        if rel_d.split(os.sep)[0] not in ("agent", "modules", "labels"):
            continue
        for name in sorted(names):
            rel = os.path.normpath(os.path.join(rel_d, name))
            if not name.endswith((".c", ".h")) or rel == "agent/basic/event-util.c":
                continue
            with open(os.path.join(d, name)) as f:
                text = strip_comments(f.read())
            for m in re.finditer(r"\bsd_event_add_(\w+)\s*\(\s*[^,]+,\s*&([^,]+),", text):
                n = text.count("\n", 0, m.start()) + 1
                kind, source = m.group(1), re.sub(r"\s+", "", m.group(2))
                if kind.startswith("time"):
                    failures.append(f"{rel}:{n} calls sd_event_add_{kind}(): use event_reset_time[_relative]() "
                                    f"(agent/basic/event-util.h), which gives the source a description")
                    continue
                if not re.search(r"sd_event_source_set_description\(\s*" + re.escape(source) + r"\s*,", text):
                    failures.append(f"{rel}:{n}: the {kind} source {source} has no description: add "
                                    f"sd_event_source_set_description({source}, \"…\") (sd-event's debug output "
                                    f"and a core dump name it)")


check_compile_commands()
check_includes()
check_event_sources()
check_agent_cycles()
for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print(f"ok: {', '.join(LAYERS)} include only their own layer and those below; no include cycle across "
      f"subsystems of agent/")
