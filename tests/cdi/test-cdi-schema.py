#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Checks CDI specs against the vendored CDI JSON schema (tests/fixtures/cdi, Apache-2.0, see SOURCE.md):

- the golden specs our builder must produce (test-cdi asserts the builder output equals them byte for
  byte) validate, after YAML parsing, so device names like "0" must have been quoted;
- the schema's own good specs validate and its bad specs do not;
- the schema's known weakness: the six loader-rejects/schema-passes-* specs, which the CDI loader and our
  own checker reject, PASS the schema. If this ever fails, the vendored schema got stricter: update
  the CDI specification (container-device-interface SPEC.md) and these fixtures.

Needs Debian's python3-jsonschema and python3-yaml (run with /usr/bin/python3)."""
import json
import pathlib
import sys

import jsonschema
import yaml

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "cdi")
    schema = json.loads((root / "schema.json").read_text())
    defs = json.loads((root / "defs.json").read_text())
    # schema.json refers to "defs.json#/..." relative to its own location.
    resolver = jsonschema.RefResolver(base_uri=(root / "schema.json").as_uri(), referrer=schema,
                                      store={(root / "defs.json").as_uri(): defs})
    validator = jsonschema.Draft7Validator(schema, resolver=resolver)

    def valid(doc):
        return validator.is_valid(doc)

    goldens = sorted((root / "golden").glob("*.yaml"))
    check(len(goldens) >= 5, f"found {len(goldens)} golden specs")
    for p in goldens:
        doc = yaml.safe_load(p.read_text())
        errors = [e.message for e in validator.iter_errors(doc)]
        check(not errors, f"golden/{p.name} validates against the CDI schema {errors or ''}")
        names = [d["name"] for d in doc["devices"]]
        check(all(isinstance(n, str) for n in names), f"golden/{p.name}: every device name is a string")
        check(isinstance(doc["cdiVersion"], str), f"golden/{p.name}: cdiVersion is a string")

    for p in sorted((root / "testdata" / "good").glob("*.json")):
        check(valid(json.loads(p.read_text())), f"testdata/good/{p.name} validates")
    for p in sorted((root / "testdata" / "bad").glob("*.json")):
        text = p.read_text()
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            check(True, f"testdata/bad/{p.name} is rejected (not JSON)")
            continue
        check(not valid(doc), f"testdata/bad/{p.name} is rejected by the schema")

    weak = sorted((root / "loader-rejects").glob("schema-passes-*.json"))
    check(len(weak) == 6, f"six schema-passes-* specs ({len(weak)})")
    for p in weak:
        check(valid(json.loads(p.read_text())),
              f"loader-rejects/{p.name} passes the JSON schema although the loader rejects it")

    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
