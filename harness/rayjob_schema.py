"""KubeRay's RayJob schema, vendored, and a strict check of a manifest against it.

The schema is the ``openAPIV3Schema`` of the ``v1`` version of KubeRay's RayJob CRD, of the
release the manifests are written for (`harness.kuberay.KUBERAY_VERSION`;
``harness/schemas/README.md`` names its source path and license). Kubernetes prunes a field its
schema does not know instead of refusing it, so a typo (``replicaz``) would be dropped without
a word; `problems` checks as ``kubectl apply --validate=strict`` does: an
unknown field is an error, except under ``x-kubernetes-preserve-unknown-fields``. The CEL rules
(``x-kubernetes-validations``) are not evaluated.

    python -m harness.rayjob_schema check rayjob.yaml    # one line per problem, exit 1 (2: no YAML)
    python -m harness.rayjob_schema vendor ray.io_rayjobs.yaml OUT.json   # regenerate the schema
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from harness.kuberay import API_VERSION, KUBERAY_VERSION, MAX_NAME_LENGTH

SCHEMA_PATH = Path(__file__).parent / "schemas" / f"rayjob-{KUBERAY_VERSION}.json"
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def vendored(crd: dict[str, Any]) -> dict[str, Any]:
    """The ``v1`` schema of a RayJob CRD, without its descriptions (everything else kept)."""
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == API_VERSION.split("/")[1]]
    return _without_descriptions(version["schema"]["openAPIV3Schema"])


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _without_descriptions(value)
            for key, value in node.items()
            if key != "description" or not isinstance(value, str)
        }
    if isinstance(node, list):
        return [_without_descriptions(item) for item in node]
    return node


def strict(schema: dict[str, Any], top: bool = True) -> dict[str, Any]:
    """`schema` as the API server reads it, for `jsonschema`: an object schema refuses the
    fields it does not name (where Kubernetes would prune them), unless it preserves unknown
    fields; ``nullable`` allows null. The top level's ``metadata`` is the API server's own
    ObjectMeta, which the CRD leaves open."""
    node = dict(schema)
    if node.get("nullable"):
        node["type"] = [node["type"], "null"]
    if node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("additionalProperties", False)
    for key in ("properties", "patternProperties"):
        if key in node:
            node[key] = {
                name: value if top and name == "metadata" else strict(value, top=False)
                for name, value in node[key].items()
            }
    for key in ("items", "additionalProperties", "not"):
        if isinstance(node.get(key), dict):
            node[key] = strict(node[key], top=False)
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [strict(item, top=False) for item in node[key]]
    return node


@cache
def _validator() -> Any:
    import jsonschema  # a dependency of Ray; only checks need it

    schema = strict(json.loads(SCHEMA_PATH.read_text()))
    return jsonschema.Draft4Validator(schema)


def problems(manifest: Any) -> list[str]:
    """Why the API server with KubeRay's CRD, or KubeRay itself, would refuse `manifest` (a
    RayJob as parsed from YAML) or drop a field of it: one line each; none for a valid one."""
    if not isinstance(manifest, dict):
        return [f"a RayJob manifest is a mapping, not {type(manifest).__name__}"]
    found = list(_metadata_problems(manifest))
    errors = sorted(_validator().iter_errors(manifest), key=lambda e: list(map(str, e.path)))
    return found + [_reason(error) for error in errors]


def _metadata_problems(manifest: dict[str, Any]) -> Iterator[str]:
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != "RayJob":
        yield f"apiVersion/kind: expected {API_VERSION} RayJob"
    name = (manifest.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not DNS_1035_LABEL.fullmatch(name):
        yield f"metadata.name: {name!r} is not a DNS-1035 label (KubeRay refuses it)"
    elif len(name) > MAX_NAME_LENGTH:
        yield f"metadata.name: {name!r} is over {MAX_NAME_LENGTH} characters (KubeRay refuses it)"


def _reason(error: Any) -> str:
    """One line: where, and what is wrong (an unknown field named by its whole path)."""
    where = _path(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        unknown = sorted(name for name in error.instance if name not in known)
        return "; ".join(f'unknown field "{_path([*error.absolute_path, n])}"' for n in unknown)
    return f"{where or '(top)'}: {' '.join(error.message.split())}"


def _path(parts: Sequence[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.rayjob_schema", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check RayJob manifests (YAML) strictly")
    check.add_argument("manifests", nargs="+", type=Path)
    vendor = commands.add_parser("vendor", help="write the schema of KubeRay's RayJob CRD")
    vendor.add_argument("crd", type=Path, help="ray-operator/config/crd/bases/ray.io_rayjobs.yaml")
    vendor.add_argument("out", type=Path)
    options = parser.parse_args(argv)

    import yaml

    if options.command == "vendor":
        schema = vendored(yaml.safe_load(options.crd.read_text()))
        options.out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
        return 0
    status = 0
    for path in options.manifests:
        try:
            manifest = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            print(f"{path}: cannot be read as YAML: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
        found = problems(manifest)
        for problem in found:
            print(f"{path}: {problem}", file=sys.stderr)
        if not found:
            print(f"{path}: valid against KubeRay {KUBERAY_VERSION}'s RayJob schema")
        status = max(status, int(bool(found)))
    return status


if __name__ == "__main__":
    sys.exit(main())
