#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Owns the agreement of the three places that describe the configuration keys: the key table in
# agent/config.c (what the daemon accepts, with its defaults), the reference tables in
# docs/configuration.md and the man page docs/man/gpu-node-agent.yaml.5. A key added, renamed or
# given another default in one of them and not the others fails here, naming the key and the file.
import os
import re
import sys

src = os.environ.get("GNA_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")


def read(rel):
    with open(os.path.join(src, rel), encoding="utf-8") as f:
        return f.read()


def code_keys():
    """{key: expected default as the docs write it} from config.c's config_keys[] table."""
    text = read("agent/config.c")
    keys = {}
    entry = re.compile(r'\{\s*"([a-z0-9.-]+)",\s*(CONFIG_[A-Z_]+),\s*CONFIG_OFF\([^)]*\)\)?,\s*'
                       r'"([^"]*)"(?:\s*,\s*(BASE_[A-Z]+))?', re.S)
    for m in entry.finditer(text):
        key, ctype, default, base = m.group(1), m.group(2), m.group(3), m.group(4)
        if base in ("BASE_ROOT", "BASE_ETC", "BASE_RUN"):
            prefix = "<" + base[5:].lower() + ">"
            default = prefix + ("/" + default if default else "")
        elif ctype in ("CONFIG_UNITS", "CONFIG_XIDS") and default == "":
            default = "[]"
        keys[key] = default
    return keys


def doc_keys():
    """{key: default} from the tables of docs/configuration.md (first column key, third default)."""
    keys = {}
    for line in read("docs/configuration.md").splitlines():
        m = re.match(r'^\| `([a-z0-9.-]+)` \|[^|]*\| ([^|]*) \|', line)
        if not m:
            continue
        d = m.group(2).strip()
        d = re.sub(r'^`(.*)`$', r'\1', d)
        keys[m.group(1)] = "" if d in ('""', "unset") else d
    return keys


def man_keys():
    """{key: default} from the .BR key " (type, default " value ) lines of the man page."""
    keys = {}
    for line in read("docs/man/gpu-node-agent.yaml.5").splitlines():
        if not line.startswith(".BR ") or "default" not in line:
            continue
        line = line.replace("\\-", "-").replace("\\(dq\\(dq", '""').replace("\\fI", "").replace("\\fB", "").replace("\\fR", "")
        head, _, tail = line[4:].partition(" (")
        names = re.findall(r'[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)+', head)
        m = re.search(r'default(?: empty\)"|"? "? ?(\S+) ?\)?)', '(' + tail)
        if not names or not m:
            continue
        d = "" if re.search(r'default (empty|unset)\)', tail) else (m.group(1) or "").rstrip(')').strip('"')
        for n in names:
            keys[n] = d
    return keys


def main():
    code = code_keys()
    errors = []
    if len(code) < 40:
        errors.append(f"agent/config.c: found only {len(code)} keys in the key table; the parser of this test is out of date")
    for where, got in (("docs/configuration.md", doc_keys()), ("docs/man/gpu-node-agent.yaml.5", man_keys())):
        for k in sorted(set(code) - set(got)):
            errors.append(f"{where}: key '{k}' (accepted by agent/config.c) is not documented")
        for k in sorted(set(got) - set(code)):
            errors.append(f"{where}: documents key '{k}', which agent/config.c does not accept")
        for k in sorted(set(code) & set(got)):
            if got[k] != code[k] and not (code[k] == "" and got[k] in ("", '""', "empty", "unset")):
                errors.append(f"{where}: key '{k}' default is '{got[k]}', agent/config.c says '{code[k]}'")
    for e in errors:
        print("FAIL:", e)
    print(f"{len(code)} keys checked in agent/config.c, docs/configuration.md and the man page")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
