#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# Owns the agreement of the three places that describe the configuration keys: the key table in
# agent/config.c (what the daemon accepts, with its defaults, and which keys the remote document may
# set), the reference tables in docs/configuration.md and the man page docs/man/gpu-node-agent.yaml.5.
# The table is read from the code itself, through tests/docs/dump-config-keys (config_keys_dump()), so
# what the docs are held to is what the daemon obeys. A key added, renamed, given another default or
# another "remote" verdict in one of them and not the others fails here, naming the key and the file.
#
# The "Remote" column of docs/configuration.md and the man page's table of remote keys are generated:
#   tests/docs/test-config-keys.py build/tests/docs/dump-config-keys --fix
# rewrites both from the table (and adds the column to a table that lacks it); then review the diff.
import os
import re
import subprocess
import sys

src = os.environ.get("GNA_SOURCE_ROOT") or os.path.join(os.path.dirname(__file__), "..", "..")
MD = "docs/configuration.md"
MAN = "docs/man/gpu-node-agent.yaml.5"
MAN_TABLE_MARK = ".\\\" The table of remote keys is generated from agent/config.c: tests/docs/test-config-keys.py --fix"
KEY_ROW = re.compile(r'^\| `([a-z0-9-]+(?:\.[a-z0-9-]+)+)` \|([^|]*)\|([^|]*)\|(.*)$')
REMOTE_CELL = re.compile(r'^ (yes|no \([a-z]+\)) $')


def path(rel):
    return os.path.join(src, rel)


def read(rel):
    with open(path(rel), encoding="utf-8") as f:
        return f.read()


def write(rel, text):
    with open(path(rel), "w", encoding="utf-8") as f:
        f.write(text)


def code_keys(dump):
    """{key: (default as the docs write it, remote verdict)} from config_keys_dump()."""
    out = subprocess.run([dump], check=True, capture_output=True, text=True).stdout
    keys = {}
    for line in out.splitlines():
        key, default, remote = line.split("\t")
        keys[key] = (default, remote)
    return keys


def md_rows(text):
    """(line index, key, type cell, default cell, remote cell or None, rest) for each key row."""
    for i, line in enumerate(text.split("\n")):
        m = KEY_ROW.match(line)
        if not m:
            continue
        rest = m.group(4)
        cell, _, after = rest.partition("|")
        if REMOTE_CELL.match(cell):
            yield i, m.group(1), m.group(2), m.group(3), cell.strip(), after
        else:
            yield i, m.group(1), m.group(2), m.group(3), None, rest


def doc_keys():
    """{key: (default, remote)} from the tables of docs/configuration.md (Key | Type | Default | Remote | …)."""
    keys = {}
    for _, key, _, default, remote, _ in md_rows(read(MD)):
        d = default.strip()
        d = re.sub(r'^`(.*)`$', r'\1', d)
        keys[key] = ("" if d in ('""', "unset") else d, remote)
    return keys


def man_keys():
    """{key: (default, remote)}: defaults from the .BR key " (type, default " value ) lines of the man page,
    remote from its generated table."""
    text = read(MAN)
    keys, remote = {}, man_remote(text)
    for line in text.splitlines():
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
            keys[n] = (d, remote.get(n))
    return keys


def man_table_span(text):
    """(first, last) line indexes of the generated table (.TS … .TE after the mark), or None."""
    lines = text.split("\n")
    if MAN_TABLE_MARK not in lines:
        return None
    start = lines.index(MAN_TABLE_MARK) + 1
    if lines[start] != ".TS":
        return None
    return start, lines.index(".TE", start)


def man_remote(text):
    span = man_table_span(text)
    if not span:
        return {}
    out = {}
    for line in text.split("\n")[span[0]:span[1]]:
        cells = line.replace("\\-", "-").split(";")
        if len(cells) == 2 and "." in cells[0]:
            out[cells[0]] = cells[1]
    return out


def man_table(code):
    rows = [".TS", "tab(;);", "lb lb", "l l.", "KEY;REMOTE"]
    rows += ["%s;%s" % (k.replace("-", "\\-"), v) for k, (_, v) in code.items()]
    return rows + [".TE"]


def fix(code):
    lines = read(MD).split("\n")
    for i, line in enumerate(lines):
        if line == "| Key | Type | Default | Meaning |":
            lines[i] = "| Key | Type | Default | Remote | Meaning |"
            if lines[i + 1] == "|-----|------|---------|---------|":
                lines[i + 1] = "|-----|------|---------|--------|---------|"
    for i, key, type_, default, remote, rest in list(md_rows("\n".join(lines))):
        if key in code:
            lines[i] = "| `%s` |%s|%s| %s |%s" % (key, type_, default, code[key][1], rest)
    write(MD, "\n".join(lines))

    text = read(MAN)
    span = man_table_span(text)
    if span:
        lines = text.split("\n")
        lines[span[0]:span[1] + 1] = man_table(code)
        write(MAN, "\n".join(lines))
    else:
        print("FAIL: %s: no generated table (a line %r, then .TS … .TE) to rewrite" % (MAN, MAN_TABLE_MARK))
        return 1
    print("rewrote the remote column of %s and the table of %s; review the diff" % (MD, MAN))
    return 0


def main():
    if len(sys.argv) < 2:
        print("usage: %s DUMP-CONFIG-KEYS [--fix]" % sys.argv[0])
        return 2
    code = code_keys(sys.argv[1])
    if "--fix" in sys.argv[2:]:
        return fix(code)
    errors = []
    if len(code) < 40:
        errors.append(f"agent/config.c: config_keys_dump() printed only {len(code)} keys")
    for where, got in ((MD, doc_keys()), (MAN, man_keys())):
        for k in sorted(set(code) - set(got)):
            errors.append(f"{where}: key '{k}' (accepted by agent/config.c) is not documented")
        for k in sorted(set(got) - set(code)):
            errors.append(f"{where}: documents key '{k}', which agent/config.c does not accept")
        for k in sorted(set(code) & set(got)):
            (cd, cr), (gd, gr) = code[k], got[k]
            if gd != cd and not (cd == "" and gd in ("", '""', "empty", "unset")):
                errors.append(f"{where}: key '{k}' default is '{gd}', agent/config.c says '{cd}'")
            if gr != cr:
                errors.append(f"{where}: key '{k}' remote is '{gr or 'missing'}', agent/config.c says '{cr}' "
                              f"(regenerate: {sys.argv[0]} {sys.argv[1]} --fix)")
    if not read(MAN).startswith("'\\\" t\n"):
        errors.append(f"{MAN}: the first line must be '\\\" t, so that man runs tbl for the table of remote keys")
    for e in errors:
        print("FAIL:", e)
    print(f"{len(code)} keys checked in agent/config.c, {MD} and the man page "
          f"({sum(1 for _, r in code.values() if r == 'yes')} remote)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
