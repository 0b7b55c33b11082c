"""``curate submit`` and ``curate status``: a crawl handed to a running Dagster deployment over
its GraphQL API (plain HTTP POSTs to ``<url>/graphql``; the webserver of ``curate deploy`` or of
the Helm chart).

Submitting a crawl: its spec is registered in the deployment's data root (read from the
``curation`` resource's configuration, or ``--data-root``), its ``crawl`` and ``source`` dynamic
partitions are added (``addDynamicPartition``), and **one asset backfill** is launched
(``launchPartitionBackfill``) over every asset's partitions of that crawl: each per-source asset
over the crawl's ``crawl|source`` keys, each crawl-level asset over the crawl. The backfill daemon
orders the runs by the dependencies, across the two partitionings (a crawl-level asset only after
every source of its crawl, the next per-source wave only after it), one run per partition key and
level, each run materializing the assets of its wave (as ``curate run`` does); the backfill is one
object in the UI, survives the submitter, and its failed partitions re-execute from the UI. While
it targets a partition, the declarative automation leaves that partition alone
(``AutomationCondition.eager()`` waits for an in-progress backfill), so a submitted crawl is not
launched twice. Why not one run per wave launched by the client: a crawl would stop where the
client stopped.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curation_dagster.deploy import graphql_post
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot, data_root_url
from stages.spec import CrawlSpec

TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
CRAWL_TAG = "curate/crawl"
POLL_S = 2.0


class SubmitError(RuntimeError):
    """The deployment refused or failed; the message is one line."""


def partition_keys(spec: CrawlSpec, program: str) -> list[str]:
    """Dagster partition keys of ``program`` in the crawl: ``crawl|source`` or ``crawl``."""
    return [spec.crawl if s is None else f"{spec.crawl}|{s}" for s in spec.partitions(program)]


def name(program: str, partition: str) -> str:
    return f"{program}[{partition}]"


@dataclass
class Dagster:
    """A Dagster webserver's GraphQL API, and the repository of the curation code location on it."""

    url: str
    location: str = ""
    repository: str = ""

    def query(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return graphql_post(self.url, query, variables)
        except urllib.error.HTTPError as exc:
            raise SubmitError(f"Dagster at {self.url} answered HTTP {exc.code} ({exc.reason})") from exc
        except (OSError, urllib.error.URLError) as exc:
            raise SubmitError(f"cannot reach Dagster at {self.url}: {getattr(exc, 'reason', exc)}") from exc
        except ValueError as exc:
            raise SubmitError(f"Dagster at {self.url}: {exc}") from exc

    def connect(self) -> Dagster:
        """Find the code location that defines the ``curation`` resource."""
        data = self.query("""{ repositoriesOrError { __typename ... on RepositoryConnection {
            nodes { name location { name } allTopLevelResourceDetails { name } } } ... on Error { message } } }""")
        repos = data["repositoriesOrError"]
        if repos["__typename"] != "RepositoryConnection":
            raise SubmitError(f"Dagster at {self.url}: {repos.get('message', repos['__typename'])}")
        for node in repos["nodes"]:
            if any(r["name"] == "curation" for r in node["allTopLevelResourceDetails"]):
                self.location, self.repository = node["location"]["name"], node["name"]
                return self
        raise SubmitError(f"Dagster at {self.url} has no code location with the curation assets loaded")

    @property
    def selector(self) -> dict[str, str]:
        return {"repositoryLocationName": self.location, "repositoryName": self.repository}

    def data_root(self) -> str:
        """The data root of the deployment's ``curation`` resource (its workdir's, when unset)."""
        data = self.query("""query($sel: ResourceSelector!) { topLevelResourceDetailsOrError(resourceSelector: $sel) {
            __typename ... on ResourceDetails { configuredValues { key value type } } ... on Error { message } } }""",
                          {"sel": {**self.selector, "resourceName": "curation"}})
        details = data["topLevelResourceDetailsOrError"]
        values = {v["key"]: v for v in details.get("configuredValues", [])}
        for key in ("data_root", "workdir"):
            entry = values.get(key)
            if entry is not None and entry["type"] != "VALUE":  # an environment variable of the deployment
                break
            if entry is not None:
                value = json.loads(entry["value"])
                return value if key == "data_root" else data_root_url(None, value)
        raise SubmitError(f"cannot read the data root of the deployment at {self.url}: give --data-root URL")

    def add_partitions(self, dimension: str, keys: list[str]) -> list[str]:
        """Add the keys missing from a dynamic partitioning; returns the ones added."""
        added = []
        for key in keys:
            data = self.query("""mutation($sel: RepositorySelector!, $dim: String!, $key: String!) {
                addDynamicPartition(repositorySelector: $sel, partitionsDefName: $dim, partitionKey: $key) {
                  __typename ... on AddDynamicPartitionSuccess { partitionKey } ... on Error { message } } }""",
                              {"sel": self.selector, "dim": dimension, "key": key})
            result = data["addDynamicPartition"]
            if result["__typename"] == "AddDynamicPartitionSuccess":
                added.append(key)
            elif result["__typename"] != "DuplicateDynamicPartitionError":
                why = result.get("message", result["__typename"])
                raise SubmitError(f"adding {dimension} partition {key!r}: {why}")
        return added

    def launch_backfill(self, spec: CrawlSpec) -> str:
        params = {
            "partitionsByAssets": [
                {"assetKey": {"path": [program]},
                 "partitions": {"ranges": [{"start": k, "end": k} for k in partition_keys(spec, program)]}}
                for program in PROGRAMS
            ],
            "title": f"crawl {spec.crawl}",
            "description": f"curate submit: every asset of crawl {spec.crawl} ({', '.join(sorted(spec.sources))})",
            "tags": [{"key": CRAWL_TAG, "value": spec.crawl}],
        }
        data = self.query("""mutation($params: LaunchBackfillParams!) {
            launchPartitionBackfill(backfillParams: $params) {
              __typename ... on LaunchBackfillSuccess { backfillId } ... on Error { message } } }""",
                          {"params": params})
        result = data["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise SubmitError(f"launching the backfill of crawl {spec.crawl}: "
                              f"{' '.join(str(result.get('message', result['__typename'])).split())[:300]}")
        return str(result["backfillId"])

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        data = self.query("""query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
            ... on PartitionBackfill { id status title tags { key value } assetBackfillData { assetBackfillStatuses {
              __typename ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted
                numPartitionsInProgress numPartitionsMaterialized numPartitionsFailed } } } }
            ... on Error { message } } }""", {"id": backfill_id})
        result = data["partitionBackfillOrError"]
        if result["__typename"] != "PartitionBackfill":
            raise SubmitError(f"backfill {backfill_id}: {result.get('message', result['__typename'])}")
        return result  # type: ignore[no-any-return]

    def latest_backfill(self, crawl: str) -> dict[str, Any] | None:
        """The newest backfill ``curate submit`` launched for ``crawl``, or None."""
        data = self.query("""{ partitionBackfillsOrError(limit: 100) { __typename ... on PartitionBackfills {
            results { id tags { key value } } } } }""")
        for entry in data["partitionBackfillsOrError"].get("results", []):  # newest first
            if {"key": CRAWL_TAG, "value": crawl} in entry["tags"]:
                return self.backfill(entry["id"])
        return None

    def failure(self, backfill_id: str) -> str:
        """The first failed run of the backfill, on one line: the asset partition and why."""
        data = self.query("""query($id: String!) { runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}],
            statuses: [FAILURE]}, limit: 20) { ... on Runs { results { runId tags { key value } } } } }""",
                          {"id": backfill_id})
        runs = data["runsOrError"].get("results", [])
        if not runs:
            return f"backfill {backfill_id} failed without a failed run (see {self.url}/runs/b/{backfill_id})"
        run = runs[-1]  # the oldest: what made the others fail, if anything did
        tags = {t["key"]: t["value"] for t in run["tags"]}
        partition = tags.get("dagster/partition", "")
        events = self.query("""query($id: ID!) { logsForRun(runId: $id, limit: 5000) { ... on EventConnection {
            events { __typename ... on ExecutionStepFailureEvent { stepKey error { message className
              cause { message className } } } ... on AssetCheckEvaluationEvent { evaluation { checkName
              assetKey { path } success severity description } }
              ... on EngineEvent { stepKey message error { message className } } } } } }""", {"id": run["runId"]})
        where = f"(run {self.url}/runs/{run['runId']})"
        items = events["logsForRun"].get("events", [])
        for event in items:
            evaluation = event.get("evaluation")
            if evaluation and not evaluation["success"] and evaluation["severity"] == "ERROR":
                asset = "/".join(evaluation["assetKey"]["path"])
                return f"{name(asset, partition)}: check {evaluation['checkName']} failed: " \
                       f"{one_line(evaluation.get('description') or '')} {where}"
        for event in items:  # a stage subprocess's own error, reported over Pipes as it closed
            if event["__typename"] == "EngineEvent" and event.get("error") and \
                    "closed with exception" in (event.get("message") or ""):
                return f"{name(event['stepKey'] or '?', partition)}: {one_line(event['error']['message'])} {where}"
        for event in items:
            if event["__typename"] == "ExecutionStepFailureEvent":
                error = event["error"] or {}
                info = error.get("cause") or error
                return f"{name(event['stepKey'] or '?', partition)}: {one_line(info.get('message') or '')} {where}"
        return f"run {run['runId']} of partition {partition} failed {where}"


def one_line(text: str) -> str:
    """An error's last meaningful line, without Dagster's ``module.Class:`` prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    head, sep, rest = last.partition(": ")
    return rest if sep and "." in head and " " not in head else last


def statuses(backfill: dict[str, Any]) -> dict[str, tuple[int, int, int, int]]:
    """Per asset: (targeted, materialized, in progress, failed) partitions of a backfill."""
    out = {}
    for entry in (backfill.get("assetBackfillData") or {}).get("assetBackfillStatuses", []):
        if entry["__typename"] == "AssetPartitionsStatusCounts":
            out["/".join(entry["assetKey"]["path"])] = (entry["numPartitionsTargeted"],
                                                        entry["numPartitionsMaterialized"],
                                                        entry["numPartitionsInProgress"], entry["numPartitionsFailed"])
    return out


def submit(dagster: Dagster, root: DataRoot, spec: CrawlSpec, log: Callable[[str], None]) -> str:
    """Register the spec, add the partitions, launch the backfill; its id. Refused while an
    earlier backfill of the crawl runs: its partitions would be written twice at once, and its
    later runs would read the new spec."""
    running = dagster.latest_backfill(spec.crawl)
    if running is not None and running["status"] not in TERMINAL:
        raise SubmitError(f"crawl {spec.crawl} has a backfill in progress ({dagster.url}/runs/b/{running['id']}): "
                          "wait for it, or cancel it in the UI, before submitting the crawl again")
    record = root.register(spec)
    log(f"crawl {spec.crawl} registered in {root.url} (#{record.sequence}, sources {', '.join(sorted(spec.sources))})")
    added = dagster.add_partitions("crawl", [spec.crawl]) + dagster.add_partitions("source", sorted(spec.sources))
    if added:
        log(f"partitions added: {', '.join(added)}")
    backfill_id = dagster.launch_backfill(spec)
    log(f"backfill {backfill_id} launched: {dagster.url}/runs/b/{backfill_id}?tab=runs")
    return backfill_id


def wait(dagster: Dagster, root: DataRoot, spec: CrawlSpec, backfill_id: str, log: Callable[[str], None],
         timeout_s: float | None = None) -> None:
    """Follow the backfill to its end, printing each asset as its partitions complete; raise
    SubmitError (one line) unless the crawl's removal ledger is committed for ``spec``."""
    t0 = time.monotonic()
    shown: dict[str, tuple[int, int, int, int]] = {}
    while True:
        backfill = dagster.backfill(backfill_id)
        now = statuses(backfill)
        for program in PROGRAMS:
            counts = now.get(program)
            if counts is None or counts == shown.get(program):
                continue
            targeted, done, running, failed = counts
            if done or failed or running:
                state = f"{done}/{targeted}" + (f", {running} running" if running else "") + \
                        (f", {failed} failed" if failed else "")
                log(f"  {time.monotonic() - t0:6.1f}s {program:<24} {state}")
            shown[program] = counts
        if backfill["status"] in TERMINAL:
            break
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise SubmitError(f"backfill {backfill_id} of crawl {spec.crawl} still {backfill['status']} after "
                              f"{timeout_s:.0f}s: {dagster.url}/runs/b/{backfill_id}")
        time.sleep(POLL_S)
    if any(c[3] for c in now.values()) or backfill["status"] in ("COMPLETED_FAILED", "FAILED"):
        raise SubmitError(dagster.failure(backfill_id))
    if backfill["status"] == "CANCELED":
        raise SubmitError(f"backfill {backfill_id} of crawl {spec.crawl} was canceled")
    if not root.published(spec):
        raise SubmitError(f"backfill {backfill_id} finished ({backfill['status']}) but crawl {spec.crawl}'s removal "
                          f"ledger is not committed in {root.url}")
    log(f"crawl {spec.crawl} done in {time.monotonic() - t0:.1f}s ({backfill['status']})")


def status_table(dagster: Dagster, crawl: str) -> list[str]:
    """``curate status``: per asset, the crawl's partitions materialized, running and failed in
    the latest backfill ``curate submit`` launched for the crawl."""
    backfill = dagster.latest_backfill(crawl)
    if backfill is None:
        raise SubmitError(f"no backfill of crawl {crawl!r} on {dagster.url} (submit it with `curate submit`)")
    now = statuses(backfill)
    lines = [f"crawl {crawl}: backfill {backfill['id']} {backfill['status']} ({dagster.url}/runs/b/{backfill['id']})",
             f"{'ASSET':<26}{'PARTITIONS':>11}{'DONE':>7}{'RUNNING':>9}{'FAILED':>8}"]
    for program in PROGRAMS:
        if program in now:
            targeted, done, running, failed = now[program]
            lines.append(f"{program:<26}{targeted:>11}{done:>7}{running:>9}{failed:>8}")
    total = [sum(c[i] for c in now.values()) for i in range(4)]
    lines.append(f"{'TOTAL':<26}{total[0]:>11}{total[1]:>7}{total[2]:>9}{total[3]:>8}")
    if total[3]:
        lines.append(f"failed: {dagster.failure(backfill['id'])}")
    return lines
