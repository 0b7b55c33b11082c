"""No secret in a URL: the one check every URL passes where it enters (source URLs, the data
root, curate.yaml's recrawl prefix), and storage options stripped of secrets before they travel.

A URL is kept for good once accepted: in crawl specs (``_crawls/<crawl>.json``), manifests,
Dagster metadata, pod command lines and logs. So a credential in it is refused, and the error
names the kind of credential, never its value. Credentials belong in the environment (the AWS
chain, ``$CURATE_STORAGE_OPTIONS``, a Kubernetes Secret), which nothing writes down.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

# The data root's fsspec options as JSON: for processes started by another (stage subprocesses,
# pods, Ray workers), in the environment, never on a command line (those show in logs and
# process lists), never in a spec, manifest or metadata.
STORAGE_OPTIONS_ENV = "CURATE_STORAGE_OPTIONS"

# Protocols whose ``name@`` part is no credential: adlfs's ``container@account``, an ssh user,
# github's ``org:repo@ref`` and git's ``repo:ref@path`` (their credentials are options).
_NAME_AT = {"abfs", "abfss", "az", "adl", "sftp", "ssh"}
_REPO_AT = {"github", "git"}
# Names of options and query parameters that carry or sign a credential (case-insensitive): a
# name containing a strong word, a weak word as the whole name (``key``, ``sig``; ``sort_key`` is
# none), or an ``x-amz-``/``x-goog-`` parameter of a presigned URL. Covers S3/GCS presigned URLs,
# Azure SAS, tokens, and the options of s3fs, gcsfs and adlfs.
_STRONG = ("secret|password|passwd|passphrase|token|credential|signature|jwt|"
           r"(access|api|account|subscription|private)[-_]?key|pkey|connection[-_]?string")
_WEAK = "sig|key|pwd|auth|authorization|sas|awsaccesskeyid|googleaccessid"
_SECRET_PARAM = re.compile(rf".*({_STRONG})|({_WEAK})$|x-(amz|goog)-.*", re.IGNORECASE)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
# host[:port] then the path: an '@' after it is part of the path (hf://datasets/org/name@rev).
_CLEAN_AUTHORITY = re.compile(r"^(\[[^\]]*\]|[^/:@?#]*)(:\d+)?([/?#]|$)")
# Bucket stores name a bucket, never host:port, first: a ':' before an '@' there is a password.
_BUCKET = {"s3", "s3a", "gs", "gcs", "oss", "r2"}


class CredentialInURL(ValueError):
    """A URL carries a credential; the message names its kind, never its value."""


def is_secret_name(name: str) -> bool:
    """True for an option or query-parameter name that holds (or signs with) a secret:
    ``secret``, ``key``, ``token``, ``aws_secret_access_key``, ``X-Amz-Signature``, ``sig``, ..."""
    return bool(_SECRET_PARAM.match(name))


def url_credential(url: str) -> str | None:
    """What kind of credential ``url`` carries (``user:password@...``, ``a token before @``,
    ``query parameter 'sig'``), or None. Every part of a chained URL (``simplecache::s3://...``)
    is looked at; a local path (no ``scheme://``) never carries one."""
    for part in url.split("::"):
        found = _SCHEME.match(part.strip())
        if found is None:
            continue
        protocol, rest = found.group(1).lower(), found.group(2)
        query = rest.split("?", 1)[1].split("#", 1)[0] if "?" in rest else ""
        for name, _ in parse_qsl(query, keep_blank_values=True):
            if is_secret_name(name):
                return f"query parameter {name!r}"
        if "@" not in rest or protocol in _REPO_AT:
            continue
        userinfo = rest.split("@", 1)[0]
        if "?" in userinfo or "#" in userinfo:  # the '@' is in the query or fragment
            continue
        # user:password@host, also when the password holds a '/' (AWS secrets do): unless the URL
        # starts with a plain host[:port] and the '@' is further down its path.
        if ":" in userinfo and (protocol in _BUCKET or not _CLEAN_AUTHORITY.match(rest)):
            return "user:password@..."
        if ":" not in userinfo and "/" not in userinfo and userinfo and protocol not in _NAME_AT:
            return "a token or user name before @"
    return None


def check_url(what: str, url: str) -> str:
    """``url`` if it carries no credential, else :class:`CredentialInURL` naming ``what`` and the
    kind of credential (not the URL: it holds the secret)."""
    kind = url_credential(url)
    if kind is not None:
        raise CredentialInURL(
            f"the {what} carries credentials ({kind}); give them through the environment (AWS_ACCESS_KEY_ID, "
            "AWS_PROFILE, $CURATE_STORAGE_OPTIONS, a Kubernetes Secret) instead: a URL is written into crawl "
            "specs, manifests and the Dagster UI"
        )
    return url


def without_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (fsspec storage options) without any secret-named entry, at any depth
    (``secret``, ``key``, ``token``, ``client_kwargs.aws_secret_access_key``, ...): what may
    travel to another process (endpoint, region, ...). The secrets stay in the environment."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if is_secret_name(str(name)):
            continue
        out[name] = without_secrets(value) if isinstance(value, Mapping) else value
    return out


def storage_options(explicit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``explicit`` fsspec options of the data root, else ``$CURATE_STORAGE_OPTIONS`` (JSON), else none."""
    if explicit:
        return dict(explicit)
    blob = os.environ.get(STORAGE_OPTIONS_ENV, "")
    return dict(json.loads(blob)) if blob.strip() else {}
