"""``curate submit`` and ``curate status``: a crawl handed to a running Dagster deployment over
its GraphQL API (plain HTTP POSTs to ``<url>/graphql``; the webserver of ``curate deploy`` or of
the Helm chart).

Submitting a crawl: its spec is registered in the deployment's data root (read from the
``curation`` resource's configuration, or ``--data-root``), its ``crawl`` and ``source`` dynamic
partitions are added (``addDynamicPartition``), and **one run** of the code location's crawl job
(``curate_run``, ``curation_dagster.run.crawl_job``) is launched (``launchRun``, config
``{crawl, force}``, tagged ``curate/crawl``): a step per program, each fanning its stale
partitions out to warm Pipes workers or pods and recording each as it finishes. The run is
queued and run by the deployment, so it survives the submitter; a run whose worker dies is
retried by the daemon (``run_retries``: from the failed step, which plans again and reruns only
what is not current), and a failed run re-executes from failure in the UI. ``--wait`` follows the
run and its retries; ``curate status`` reads the crawl's newest run.
"""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from curation_dagster.ops.deploy import graphql_post
from stages.catalog import PROGRAMS
from stages.dataroot import DataRoot, data_root_url
from stages.spec import CrawlSpec

# Run statuses (GraphQL RunStatus) of a run that is over, and of one queued or under way.
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
ACTIVE = ["QUEUED", "NOT_STARTED", "MANAGED", "STARTING", "STARTED", "CANCELING"]
CRAWL_TAG = "curate/crawl"
CRAWL_JOB = "curate_run"  # curation_dagster.run.crawl_job.CRAWL_JOB (not imported: it loads dagster)
POLL_S = 1.0
ADD_AT_ONCE = 100  # dynamic partitions added by one GraphQL request
RETRY_WAIT_S = 300.0  # a failed run tagged to be retried: how long --wait waits for its retry


class SubmitError(RuntimeError):
    """The deployment refused or failed; the message is one line."""


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
        """Add the keys missing from a dynamic partitioning; returns the ones added. Up to
        ``ADD_AT_ONCE`` a request (one ``addDynamicPartition`` each, aliased): a crawl of 1,000
        sources is 10 requests, not 1,000."""
        added = []
        for start in range(0, len(keys), ADD_AT_ONCE):
            chunk = keys[start:start + ADD_AT_ONCE]
            fields = " ".join(
                f"a{i}: addDynamicPartition(repositorySelector: $sel, partitionsDefName: $dim, partitionKey: $k{i}) "
                "{ __typename ... on AddDynamicPartitionSuccess { partitionKey } ... on Error { message } }"
                for i in range(len(chunk)))
            names = "".join(f", $k{i}: String!" for i in range(len(chunk)))
            data = self.query(f"mutation($sel: RepositorySelector!, $dim: String!{names}) {{ {fields} }}",
                              {"sel": self.selector, "dim": dimension, **{f"k{i}": k for i, k in enumerate(chunk)}})
            for i, key in enumerate(chunk):
                result = data[f"a{i}"]
                if result["__typename"] == "AddDynamicPartitionSuccess":
                    added.append(key)
                elif result["__typename"] != "DuplicateDynamicPartitionError":
                    why = result.get("message", result["__typename"])
                    raise SubmitError(f"adding {dimension} partition {key!r}: {why}")
        return added

    def launch_run(self, spec: CrawlSpec, force: bool = False) -> str:
        """One run of the crawl job for ``spec``'s crawl; its id."""
        params = {
            "selector": {**self.selector, "jobName": CRAWL_JOB},
            "runConfigData": {"crawl": spec.crawl, "force": force},
            "executionMetadata": {"tags": [{"key": CRAWL_TAG, "value": spec.crawl}]},
        }
        data = self.query("""mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } }
            ... on RunConfigValidationInvalid { errors { message } } ... on Error { message } } }""",
                          {"params": params})
        result = data["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            why = result.get("message") or "; ".join(e["message"] for e in result.get("errors", [])) \
                or result["__typename"]
            raise SubmitError(f"launching the run of crawl {spec.crawl}: {' '.join(str(why).split())[:300]}")
        return str(result["run"]["runId"])

    def runs(self, tags: dict[str, str], statuses: list[str] | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Runs with every one of ``tags`` (newest first): id, status, tags."""
        flt: dict[str, Any] = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
        if statuses:
            flt["statuses"] = statuses
        data = self.query("""query($filter: RunsFilter!, $limit: Int!) { runsOrError(filter: $filter, limit: $limit) {
            __typename ... on Runs { results { runId status tags { key value } } } ... on Error { message } } }""",
                          {"filter": flt, "limit": limit})
        runs = data["runsOrError"]
        if runs["__typename"] != "Runs":
            raise SubmitError(f"Dagster at {self.url}: {runs.get('message', runs['__typename'])}")
        return list(runs["results"])

    def run(self, run_id: str) -> dict[str, Any]:
        data = self.query("""query($id: ID!) { runOrError(runId: $id) { __typename
            ... on Run { runId status tags { key value } stepStats { stepKey status } } ... on Error { message } } }""",
                          {"id": run_id})
        result = data["runOrError"]
        if result["__typename"] != "Run":
            raise SubmitError(f"run {run_id}: {result.get('message', result['__typename'])}")
        return result  # type: ignore[no-any-return]

    def events(self, run_id: str, cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """The run's materializations, planned materializations and step failures after ``cursor``."""
        data = self.query("""query($id: ID!, $cursor: String) { logsForRun(runId: $id, afterCursor: $cursor,
            limit: 10000) { __typename ... on EventConnection { cursor events { __typename
              ... on MaterializationEvent { stepKey partition assetKey { path } }
              ... on AssetMaterializationPlannedEvent { stepKey assetKey { path } }
              ... on ExecutionStepFailureEvent { stepKey error { message className cause { message className } } }
            } } ... on Error { message } } }""", {"id": run_id, "cursor": cursor})
        result = data["logsForRun"]
        if result["__typename"] != "EventConnection":
            raise SubmitError(f"the events of run {run_id}: {result.get('message', result['__typename'])}")
        return list(result["events"]), result.get("cursor") or cursor

    def latest_run(self, crawl: str) -> dict[str, Any] | None:
        """The newest run of ``crawl``'s crawl job (a retry included), or None."""
        runs = self.runs({CRAWL_TAG: crawl}, limit=1)
        return self.run(runs[0]["runId"]) if runs else None

    def failure(self, run_id: str) -> str:
        """Why the run failed, on one line: its failed step's error (the partition and why)."""
        where = f"(run {self.url}/runs/{run_id})"
        events, _ = self.events(run_id)
        for event in events:
            if event["__typename"] == "ExecutionStepFailureEvent":
                error: dict[str, Any] = event["error"] or {}
                cause: dict[str, Any] | None = error.get("cause")
                info = cause if cause and "Failure" not in error.get("className", "") else error
                return f"{one_line(info.get('message') or '')} {where}"
        return f"run {run_id} failed outside its steps {where}"


def one_line(text: str) -> str:
    """An error's last meaningful line, without Dagster's ``module.Class:`` prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    head, sep, rest = last.partition(": ")
    return rest if sep and "." in head and " " not in head else last


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run.get("tags", [])}


def submit(dagster: Dagster, root: DataRoot, spec: CrawlSpec, log: Callable[[str], None], force: bool = False) -> str:
    """Register the spec, add the partitions, launch the crawl's run; its id. Refused while an
    earlier run of the crawl is queued or under way: it would read the new spec midway."""
    active = dagster.runs({CRAWL_TAG: spec.crawl}, ACTIVE, limit=1)
    if active:
        raise SubmitError(f"crawl {spec.crawl} has a run in progress ({dagster.url}/runs/{active[0]['runId']}): "
                          "wait for it, or terminate it in the UI, before submitting the crawl again")
    record = root.register(spec)
    log(f"crawl {spec.crawl} registered in {root.url} (#{record.sequence}, sources {', '.join(sorted(spec.sources))})")
    added = dagster.add_partitions("crawl", [spec.crawl]) + dagster.add_partitions("source", sorted(spec.sources))
    if added:
        log(f"partitions added: {', '.join(added)}")
    run_id = dagster.launch_run(spec, force)
    log(f"run {run_id} launched: {dagster.url}/runs/{run_id}")
    return run_id


@dataclass
class Followed:
    """What ``--wait`` has seen of a crawl's run and its retries: materialized partitions per program."""

    done: dict[str, set[str]]
    runs: list[str]


def wait(dagster: Dagster, root: DataRoot, spec: CrawlSpec, run_id: str, log: Callable[[str], None],
         timeout_s: float | None = None) -> Followed:
    """Follow the run (and the retries the daemon launches for it) to its end, printing each
    program as its partitions are recorded; raise SubmitError (one line) unless it succeeded and
    the crawl's removal ledger is committed for ``spec``."""
    t0 = time.monotonic()
    followed = Followed({}, [run_id])
    cursor: str | None = None
    while True:
        events, cursor = dagster.events(run_id, cursor)
        changed: dict[str, int] = {}
        for event in events:
            if event["__typename"] == "MaterializationEvent":
                program = "/".join(event["assetKey"]["path"])
                followed.done.setdefault(program, set()).add(event.get("partition") or spec.crawl)
                changed[program] = len(followed.done[program])
        for program in PROGRAMS:
            if program in changed:
                log(f"  {time.monotonic() - t0:6.1f}s {program:<24} {changed[program]}/{len(spec.partitions(program))}")
        run = dagster.run(run_id)
        if run["status"] in TERMINAL:
            if run["status"] == "FAILURE" and _will_retry(dagster, run):
                retry = _retry(dagster, run_id, t0, timeout_s)
                log(f"  {time.monotonic() - t0:6.1f}s run {run_id} failed ({dagster.failure(run_id)}); "
                    f"retried as run {retry}: {dagster.url}/runs/{retry}")
                run_id, cursor = retry, None
                followed.runs.append(retry)
                continue
            break
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise SubmitError(f"run {run_id} of crawl {spec.crawl} still {run['status']} after {timeout_s:.0f}s: "
                              f"{dagster.url}/runs/{run_id}")
        time.sleep(POLL_S)
    if run["status"] == "FAILURE":
        raise SubmitError(dagster.failure(run_id))
    if run["status"] == "CANCELED":
        raise SubmitError(f"run {run_id} of crawl {spec.crawl} was canceled")
    if not root.published(spec):
        raise SubmitError(f"run {run_id} succeeded but crawl {spec.crawl}'s removal ledger is not committed in "
                          f"{root.url}")
    log(f"crawl {spec.crawl} done in {time.monotonic() - t0:.1f}s ({len(followed.runs)} run(s))")
    return followed


def _will_retry(dagster: Dagster, run: dict[str, Any]) -> bool:
    """Whether the deployment retries this failed run: Dagster tags it (``dagster/will_retry``) a
    moment after it stores the failure, so an untagged one is read again for a few seconds."""
    deadline = time.monotonic() + 15
    while "dagster/will_retry" not in tags(run) and time.monotonic() < deadline:
        time.sleep(0.5)
        run = dagster.run(run["runId"])
    return tags(run).get("dagster/will_retry") == "true"


def _retry(dagster: Dagster, run_id: str, t0: float, timeout_s: float | None) -> str:
    """The retry the daemon launches for a failed run (tagged ``dagster/parent_run_id``)."""
    deadline = time.monotonic() + (RETRY_WAIT_S if timeout_s is None else max(timeout_s - (time.monotonic() - t0), 0))
    while True:
        children = dagster.runs({"dagster/parent_run_id": run_id}, limit=1)
        if children:
            return str(children[0]["runId"])
        if time.monotonic() > deadline:
            raise SubmitError(f"run {run_id} failed ({dagster.failure(run_id)}) and its retry did not start")
        time.sleep(POLL_S)


def status_table(dagster: Dagster, root: DataRoot, crawl: str) -> list[str]:
    """``curate status``: the crawl's newest run, and per program its partitions, those recorded by
    that run and the runs it retried, and its step's state in the newest run that has the step."""
    run = dagster.latest_run(crawl)
    if run is None:
        raise SubmitError(f"no run of crawl {crawl!r} on {dagster.url} (submit it with `curate submit`)")
    record = root.record(crawl)
    first = tags(run).get("dagster/root_run_id", run["runId"])
    chain = [dagster.run(first)] if first != run["runId"] else []
    chain += [dagster.run(r["runId"]) for r in reversed(dagster.runs({"dagster/root_run_id": first}))
              if r["runId"] != run["runId"]] + [run]  # oldest first
    recorded: dict[str, set[str]] = {}
    steps: dict[str, str] = {}
    for each in chain:
        events, _ = dagster.events(each["runId"])
        for event in events:
            if event["__typename"] == "MaterializationEvent":
                recorded.setdefault("/".join(event["assetKey"]["path"]), set()).add(event.get("partition") or crawl)
        steps.update({s["stepKey"]: s["status"] for s in each.get("stepStats", [])})
    lines = [f"crawl {crawl}: run {run['runId']} {run['status']} ({dagster.url}/runs/{run['runId']})"
             + (f", retry of {len(chain) - 1} run(s)" if len(chain) > 1 else ""),
             f"{'PROGRAM':<26}{'PARTITIONS':>11}{'RECORDED':>10}  STEP"]
    for program in PROGRAMS:
        total = len(record.spec.partitions(program)) if record is not None else 0
        lines.append(f"{program:<26}{total:>11}{len(recorded.get(program, ())):>10}  "
                     f"{(steps.get(program) or 'not started').lower()}")
    if run["status"] == "FAILURE":
        lines.append(f"failed: {dagster.failure(run['runId'])}")
    return lines
