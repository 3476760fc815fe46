"""Kubernetes objects checked against a CustomResourceDefinition's published
OpenAPI schema, as the API server checks them (offline).

The schemas are the Kubeflow Trainer v2 CRDs in ``tests/support/kubeflow/``
(``SOURCE.md`` says where from). ``strict`` also rejects fields the schema
does not list, as ``kubectl apply --validate=strict`` does. Not checked:
CEL rules (``x-kubernetes-validations``) and admission webhooks.
"""

import copy
import functools
import gzip
import hashlib
import pathlib
from typing import Dict, List, Tuple

CRD_DIR = pathlib.Path(__file__).with_name("kubeflow")


def crd_texts() -> Dict[str, bytes]:
    """{file name without .gz: the CRD's bytes}."""
    return {path.name[:-3]: gzip.decompress(path.read_bytes())
            for path in sorted(CRD_DIR.glob("*.yaml.gz"))}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=2)
def schemas(strict: bool = True) -> Dict[Tuple[str, str], dict]:
    """{(apiVersion, kind): the version's openAPIV3Schema}."""
    import yaml  # pylint: disable=import-outside-toplevel

    found = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # (libyaml's: 18x faster here)
    for text in crd_texts().values():
        crd = yaml.load(text, Loader=loader)  # nosec: a safe loader
        for version in crd["spec"]["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            if strict:
                _no_unknown_fields(schema)
            api_version = f"{crd['spec']['group']}/{version['name']}"
            found[(api_version, crd["spec"]["names"]["kind"])] = schema
    return found


def errors(manifest: dict, strict: bool = True) -> List[str]:
    """Every schema violation of ``manifest``, as "path: message"; [] if valid."""
    import jsonschema  # pylint: disable=import-outside-toplevel

    key = (manifest.get("apiVersion"), manifest.get("kind"))
    known = schemas(strict)
    if key not in known:
        return [f"no CRD for apiVersion {key[0]!r}, kind {key[1]!r} (known: {sorted(known)})"]
    validator = jsonschema.Draft4Validator(known[key])
    return [f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in validator.iter_errors(manifest)]


def _no_unknown_fields(schema) -> None:
    if isinstance(schema, dict):
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        for value in schema.values():
            _no_unknown_fields(value)
    elif isinstance(schema, list):
        for value in schema:
            _no_unknown_fields(value)
