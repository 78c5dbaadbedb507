"""Run one variant (thinking x workload) against a serving engine and read its counters.

The farm's own prompts go straight to the engine's chat endpoint; harness workloads
run an eval harness through a recording proxy (``farm.workload.harness``) so that
per-request acceptance is kept as for the farm's own prompts. Either way the
engine's metrics are scraped before and after, and the difference is the variant's
server-wide reading.

What the engine answers is not trusted: an answer the adapter cannot read fails its
request with what was wrong; a scrape that cannot be read, or counters that went
backwards between the two scrapes, make the variant's server-wide counters unusable
(``VariantRun.counters_unusable``), and the requests keep theirs. An engine that
stops answering (every request in flight timed out) gets no more requests: the
rest of the variant fails at once instead of each waiting ``request_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from farm.analysis.sequential import decide_look, sequential_record
from farm.analysis.stats import AcceptanceSample
from farm.engines import EngineAdapter, EngineProcess, ServerLaunch
from farm.engines.base import EngineOutputError
from farm.errors import CellError, EngineError, FarmError, SpecError
from farm.paths import farm_home
from farm.plan import Variant
from farm.records import (
    LookDecision,
    RequestRecord,
    SequentialRecord,
    SpecCounters,
    VariantResult,
    summed_counters,
)
from farm.runner.task import CellTask, SequentialLooks
from farm.spec import WorkloadSpec
from farm.spec.parts import HarnessTool
from farm.workload.context import ContextBuilder, RequestContext, load_tokenizer
from farm.workload.harness import (
    HarnessError,
    harness_command,
    join_requests,
    parse_outcome,
    run_harness,
)
from farm.workload.harness_envs import ensure_harness_env
from farm.workload.prompts import LoadedWorkload, Prompt, Scorer, Turn, scorer_for
from farm.workload.proxy import RecordingProxy

__all__ = ["VariantRun", "counters_from_log", "run_variant", "variant_counters"]

# A metrics endpoint answers in milliseconds; one that does not within this is stuck.
_SCRAPE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class VariantRun:
    """A measured variant and what is wrong with it, if anything.

    ``counters_unusable`` says why the server-wide counters could not be read (they
    are then zero; per-request counters are kept). ``all_failed`` says why no
    request of the variant succeeded (the first failure), None when one did.
    """

    result: VariantResult
    counters_unusable: str | None = None

    @property
    def all_failed(self) -> str | None:
        requests = self.result.requests
        if not requests or any(r.error is None for r in requests):
            return None
        first = requests[0]
        return f"all {len(requests)} requests failed; first, {first.prompt_id}: {first.error}"


@dataclass(frozen=True)
class _Unanswered:
    """Why a request got no usable answer; ``timed_out`` when the engine was silent."""

    error: str
    timed_out: bool = False


class _Silence:
    """Counts requests in a row that the engine left unanswered (timed out).

    When ``limit`` requests in a row got no answer within the request timeout, the
    engine is taken as hung and no further request is sent.
    """

    def __init__(self, limit: int, timeout_s: float) -> None:
        self._limit = max(limit, 1)
        self._timeout_s = timeout_s
        self._in_a_row = 0
        self.verdict: str | None = None

    def answered(self) -> None:
        self._in_a_row = 0

    def timed_out(self) -> None:
        self._in_a_row += 1
        if self._in_a_row >= self._limit and self.verdict is None:
            self.verdict = (
                f"engine stopped answering: the last {self._in_a_row} requests got no answer "
                f"within {self._timeout_s:.0f} s (timeouts.request_s)"
            )


async def run_variant(
    engine: EngineProcess,
    adapter: EngineAdapter,
    launch: ServerLaunch,
    task: CellTask,
    variant: Variant,
    workload: LoadedWorkload,
) -> VariantRun:
    """Send every prompt of ``workload`` for ``variant`` (or run its harness).

    A request that fails (HTTP error, timeout, unreadable answer) is recorded with
    its error; EngineError when the engine has exited meanwhile.
    """
    if workload.spec.harness is not None:
        return await _run_harness_variant(engine, adapter, launch, task, variant, workload)
    spec = workload.spec
    served = task.model.served_name or task.model.name
    score = scorer_for(spec.scorer)
    limits = httpx.Limits(max_connections=spec.concurrency)
    gate = asyncio.Semaphore(spec.concurrency)
    silence = _Silence(spec.concurrency, task.timeouts.request_s)
    async with httpx.AsyncClient(
        base_url=engine.url, timeout=task.timeouts.request_s, limits=limits
    ) as client:
        log_path = Path(task.log_dir) / f"{task.cell.cell_id}.log"
        chat = _Chat(
            client, engine, adapter, launch, variant, spec, served, score, gate, silence, log_path
        )
        chat.contexts = await _contexts(chat, task, workload)
        before = await _scrape(client, adapter, launch, engine, task)
        t0 = time.monotonic()
        looks = task.looks_for(variant)
        sequential = None
        if looks is None:
            conversations = await asyncio.gather(*(chat.converse(p) for p in workload.prompts))
            records = chat.with_counters([r for turns in conversations for r in turns])
        else:
            records, sequential = await _in_looks(chat, workload.prompts, looks)
        elapsed = time.monotonic() - t0
        after = await _scrape(client, adapter, launch, engine, task)
    failed = sum(r.error is not None for r in records)
    decided = f"; {sequential.describe()}" if sequential is not None else ""
    print(
        f"[{task.cell.cell_id}] {variant.key}: {len(records)} requests ({failed} failed) "
        f"in {elapsed:.1f} s{decided}",
        flush=True,
    )
    metrics, unusable = server_counters(before, after)
    return VariantRun(
        VariantResult(
            axes=variant.axes,
            counters=variant_counters(metrics, records) if unusable is None else metrics,
            requests=tuple(records),
            elapsed_s=elapsed,
            concurrency=spec.concurrency,
            sequential=sequential,
        ),
        counters_unusable=unusable,
    )


async def _contexts(
    chat: _Chat, task: CellTask, workload: LoadedWorkload
) -> dict[str, RequestContext]:
    """Each prompt record's context at the variant's context length (none at 0)."""
    tokens = int(chat.variant.axes["context"])
    if not tokens or not workload.prompts:
        return {}
    try:
        tokenizer = load_tokenizer(task.model_path)
        first = workload.prompts[0]
        turn = (first.prompt, first.answer or "")
        overhead = await _template_tokens(chat, turn)
        if overhead is not None:
            overhead -= sum(len(tokenizer.encode(text)) for text in turn)
        builder = ContextBuilder(
            workload.spec.context,
            workload.prompts,
            tokenizer,
            workload.context_document,
            max(0, overhead or 0),
        )
    except (SpecError, httpx.HTTPError, LookupError, TypeError, ValueError) as exc:
        raise CellError(f"{chat.variant.key}: context of {tokens} tokens: {exc}") from None
    return {p.id: builder.build(tokens, i) for i, p in enumerate(workload.prompts)}


async def _template_tokens(chat: _Chat, turn: tuple[str, str]) -> int | None:
    """The tokens one earlier turn adds to a request as the engine renders it (its
    words and the chat template's markers around them); None when the engine cannot
    count them, and then only the words count."""
    counts = []
    for history in ((), (turn,)):
        body = chat.adapter.chat_request(chat.served, turn[0], chat.variant, chat.spec, history)
        request = chat.adapter.tokenize_request(body)
        if request is None:
            return None
        response = await chat.client.post(request[0], json=request[1])
        response.raise_for_status()
        counts.append(int(response.json()["count"]))
    return counts[1] - counts[0]


async def _in_looks(
    chat: _Chat, prompts: Sequence[Prompt], looks: SequentialLooks
) -> tuple[list[RequestRecord], SequentialRecord | None]:
    """Send ``prompts`` look by look, deciding after each, until a look decides.

    Each look's prompts go out together (``concurrency`` at a time) and are all
    answered before the look is judged, so the server stays up between looks and a
    look sees exactly the prompts of its planned count (fewer where requests
    failed). None when no look had two prompts with counters on both sides.
    """
    design = looks.design
    reference = looks.reference.sample()
    known = set(reference.prompt_ids)
    records: list[RequestRecord] = []
    made: list[LookDecision] = []
    sent = 0
    for look, until in enumerate(design.looks):
        conversations = await asyncio.gather(*(chat.converse(p) for p in prompts[sent:until]))
        sent = until
        records += chat.with_counters([r for turns in conversations for r in turns])
        candidate = AcceptanceSample.from_requests(records)
        shared = [p for p in candidate.prompt_ids if p in known]
        try:
            decision = decide_look(
                reference.take(shared),
                candidate.take(shared),
                design,
                look,
                name=looks.name,
                calibration=looks.reference.calibration,
            )
        except ValueError:
            continue  # too few prompts with drafts on both sides to judge this look
        made.append(decision)
        if decision.decision != "continue":
            break
    if not made:
        return records, None
    record = sequential_record(design, tuple(made))
    return records, record.model_copy(
        update={
            "reference_sweep_id": looks.reference.sweep_id,
            "reference_cell_id": looks.reference.cell_id,
            "reference_digest": looks.reference.digest,
            "calibration": looks.reference.calibration,
        }
    )


@dataclass
class _Chat:
    """Sends the farm's own prompts of one variant to the engine's chat endpoint.

    ``gate`` holds at most ``concurrency`` requests in flight, ``silence`` stops
    sending once the engine has gone quiet. ``logged_ids`` collects (prompt -> response
    id) the answers whose counters the engine wrote to its log instead.
    """

    client: httpx.AsyncClient
    engine: EngineProcess
    adapter: EngineAdapter
    launch: ServerLaunch
    variant: Variant
    spec: WorkloadSpec
    served: str
    score: Scorer | None
    gate: asyncio.Semaphore
    silence: _Silence
    log_path: Path
    # Each prompt record's context (the context axis), by prompt id; none when absent.
    contexts: Mapping[str, RequestContext] = field(default_factory=dict)
    logged_ids: dict[str, str] = field(default_factory=dict)

    def with_counters(self, records: list[RequestRecord]) -> list[RequestRecord]:
        """``records`` with the counters the engine wrote to its log filled in."""
        if not self.logged_ids:
            return records
        return counters_from_log(self.adapter, self.log_path, records, self.logged_ids)

    async def converse(self, prompt: Prompt) -> list[RequestRecord]:
        """The records of every turn of one prompt record, in order. A turn that fails
        ends the conversation: the turns after it are recorded as not sent."""
        records: list[RequestRecord] = []
        context = self.contexts.get(prompt.id, RequestContext())
        history: list[tuple[str, str]] = list(context.history)
        for request_id, turn in prompt.conversation():
            if records and records[-1].error is not None:
                reason = f"not sent: turn {len(records)} of the conversation failed"
                records.append(_failed_request(request_id, time.monotonic(), reason))
                continue
            if not records:
                turn = turn.model_copy(update={"prompt": context.first_prompt(turn.prompt)})
            records.append(await self.send(request_id, turn, history))
            history.append((turn.prompt, records[-1].output_text or ""))
        if prompt.category is None:
            return records
        return [r.model_copy(update={"category": prompt.category}) for r in records]

    async def send(
        self, request_id: str, turn: Turn, history: Sequence[tuple[str, str]] = ()
    ) -> RequestRecord:
        """The record of one request: its answer, or the failure with its error;
        raises EngineError when the engine has exited."""
        body = self.adapter.chat_request(self.served, turn.prompt, self.variant, self.spec, history)
        async with self.gate:
            t0 = time.monotonic()
            if self.silence.verdict is not None:
                return _failed_request(request_id, t0, f"not sent: {self.silence.verdict}")
            response = await _post_chat(
                self.client, self.launch.chat_path, body, self.engine, self.variant
            )
            if isinstance(response, _Unanswered):
                if response.timed_out:
                    self.silence.timed_out()
                else:
                    self.silence.answered()
                return _failed_request(request_id, t0, response.error)
            self.silence.answered()
            latency = time.monotonic() - t0
        try:
            done = self.adapter.completion_from_response(response.content)
        except EngineOutputError as exc:
            return _failed_request(request_id, t0, f"unreadable answer: {exc}", latency)
        if done.counters is None and done.request_id:
            self.logged_ids[request_id] = done.request_id
        return RequestRecord(
            prompt_id=request_id,
            output_text=done.text,
            completion_tokens=done.completion_tokens,
            finish_reason=done.finish_reason,
            latency_s=latency,
            correct=self.score(done.text, turn.answer)
            if self.score and turn.answer is not None
            else None,
            counters=done.counters,
        )


async def _post_chat(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    engine: EngineProcess,
    variant: Variant,
) -> httpx.Response | _Unanswered:
    """The engine's answer to one chat request, or why there is none; raises
    EngineError when the engine has exited."""
    try:
        try:
            response = await client.post(path, json=body)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A pooled keep-alive connection the server closed just as it was reused
            # (seen once in 1600 requests); greedy requests are safe to send again,
            # and a dead engine fails the retry too.
            response = await client.post(path, json=body)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return _Unanswered(f"HTTP {exc.response.status_code}: {exc.response.text[:300]}")
    except httpx.TransportError as exc:
        timed_out = isinstance(exc, httpx.TimeoutException)
        # A refused connection may come a moment before the exit can be seen; a
        # timeout says the engine is there but silent.
        if await engine.aexited(within_s=0 if timed_out else 3):
            raise EngineError(
                f"engine exited with code {engine.returncode} during variant {variant.key}"
            ) from exc
        if timed_out:
            waited = client.timeout.read or 0
            return _Unanswered(
                f"{type(exc).__name__}: no answer within {waited:.0f} s (timeouts.request_s)", True
            )
        return _Unanswered(f"{type(exc).__name__}: {exc}")
    return response


async def _scrape(
    client: httpx.AsyncClient,
    adapter: EngineAdapter,
    launch: ServerLaunch,
    engine: EngineProcess,
    task: CellTask,
) -> SpecCounters | str:
    """The engine's cumulative speculative counters, read from its metrics endpoint,
    or why they cannot be used; raises EngineError when the engine has exited."""
    what = f"GET {launch.metrics_path}"
    timeout = min(_SCRAPE_TIMEOUT_S, task.timeouts.request_s)
    try:
        response = await client.get(launch.metrics_path, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        return f"{what} answered HTTP {exc.response.status_code}: {exc.response.text[:200]}"
    except httpx.TimeoutException:
        return f"{what} did not answer within {timeout:.0f} s"
    except httpx.TransportError as exc:
        if await engine.aexited():
            raise EngineError(f"engine exited with code {engine.returncode}") from exc
        return f"{what} failed: {type(exc).__name__}: {exc}"
    try:
        return adapter.counters_from_metrics(response.text)
    except EngineOutputError as exc:
        return f"{what}: {exc}"


def server_counters(
    before: SpecCounters | str, after: SpecCounters | str
) -> tuple[SpecCounters, str | None]:
    """The counters accumulated between two scrapes, and why they are unusable
    (then zero): a scrape that could not be read, or a counter that went backwards
    (the engine restarted or reset its metrics meanwhile)."""
    for scrape, which in ((before, "before"), (after, "after")):
        if isinstance(scrape, str):
            return SpecCounters(), f"metrics scrape {which} the variant: {scrape}"
    assert isinstance(before, SpecCounters) and isinstance(after, SpecCounters)
    fields = _fields(before, after)
    backwards = [f"{name} {old} -> {new}" for name, old, new in fields if new < old]
    if backwards:
        return SpecCounters(), (
            "counters went backwards between the scrapes before and after the variant "
            f"({', '.join(backwards)}): the engine restarted or reset its metrics"
        )
    scalars = {name: new - old for name, old, new in fields if "[" not in name}
    per_pos = tuple(new - old for name, old, new in fields if "[" in name)
    return SpecCounters(**scalars, accepted_per_pos=per_pos), None


def _fields(before: SpecCounters, after: SpecCounters) -> list[tuple[str, int, int]]:
    """``(name, before, after)`` of every counter, per-position ones last."""
    width = max(len(after.accepted_per_pos), len(before.accepted_per_pos))
    old, new = before.counts(width), after.counts(width)
    return [(name, old[name], new[name]) for name in new]


def counters_from_log(
    adapter: EngineAdapter,
    log_path: Path,
    records: list[RequestRecord],
    logged_ids: dict[str, str],
) -> list[RequestRecord]:
    """Per-request counters that the engine wrote to its log instead of the response
    (sglang before 0.5.13), matched by response id (``logged_ids``: prompt -> id)."""
    by_id = adapter.request_counters_from_log(log_path.read_text(errors="replace"))
    return [
        r.model_copy(update={"counters": by_id[logged_ids[r.prompt_id]]})
        if r.counters is None and logged_ids.get(r.prompt_id) in by_id
        else r
        for r in records
    ]


def variant_counters(metrics: SpecCounters, records: Sequence[RequestRecord]) -> SpecCounters:
    """The metrics delta; the sum of per-request counters when the engine exports no
    differencable counters (sglang before 0.5.14 has only gauges)."""
    if metrics.drafts or not any(r.counters for r in records):
        return metrics
    summed = summed_counters([r.counters for r in records if r.counters is not None])
    # The engine-wide counters (steps, prefix cache) stay the metrics delta's.
    return metrics.model_copy(
        update={
            "drafts": summed.drafts,
            "draft_tokens": summed.draft_tokens,
            "accepted": summed.accepted,
            "accepted_per_pos": summed.accepted_per_pos,
        }
    )


async def _run_harness_variant(
    engine: EngineProcess,
    adapter: EngineAdapter,
    launch: ServerLaunch,
    task: CellTask,
    variant: Variant,
    workload: LoadedWorkload,
) -> VariantRun:
    """Run the workload's eval harness against the engine through a recording proxy.

    Prometheus deltas around the run are the server-wide reading; the proxy's
    per-request counters, scored by the harness's samples, are the per-request one.
    """
    spec = workload.spec
    harness = spec.harness
    assert harness is not None
    served = task.model.served_name or task.model.name
    # The variant's request fields (thinking, per-request counters) fill what the
    # harness leaves unset; the prompt is the harness's.
    fields = adapter.chat_request(served, "", variant, spec)
    out_dir = Path(task.log_dir) / f"{task.cell.cell_id}.{variant.key}.harness"
    out_dir.mkdir(parents=True, exist_ok=True)
    async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
        before = await _scrape(client, adapter, launch, engine, task)
        t0 = time.monotonic()
        async with RecordingProxy(
            engine.url, fields, adapter.parse_completion, task.timeouts.request_s
        ) as proxy:
            python = harness_python(harness.tool)
            command = harness_command(spec, served, proxy.url, out_dir, python)
            try:
                await run_harness(command, harness.timeout_s, out_dir / "harness.log")
            except HarnessError:
                if await engine.aexited():
                    raise EngineError(
                        f"engine exited with code {engine.returncode} during variant {variant.key}"
                    ) from None
                raise
        elapsed = time.monotonic() - t0
        after = await _scrape(client, adapter, launch, engine, task)
    outcome = parse_outcome(command, harness)
    records = join_requests(proxy.exchanges, outcome.samples)
    accuracy = "n/a" if outcome.accuracy is None else f"{outcome.accuracy:.3f}"
    print(
        f"[{task.cell.cell_id}] {variant.key}: {harness.tool} {outcome.task} "
        f"{len(records)} requests in {elapsed:.1f} s, {outcome.metric} {accuracy}",
        flush=True,
    )
    counters, unusable = server_counters(before, after)
    return VariantRun(
        VariantResult(
            axes=variant.axes,
            counters=counters,
            requests=records,
            elapsed_s=elapsed,
            concurrency=spec.concurrency,
        ),
        counters_unusable=unusable,
    )


def harness_python(tool: HarnessTool) -> Path | None:
    """The interpreter of ``tool``'s own environment on this node (built on first use,
    under FARM_HOME's cache); None for lm-eval, which runs in the farm's. Raises
    CellError when the environment cannot be built."""
    if tool == "lm-eval":
        return None
    try:
        return ensure_harness_env(tool, farm_home() / "cache", lambda line: print(line, flush=True))
    except FarmError as exc:
        raise CellError(f"the {tool} harness environment could not be built: {exc}") from None


def _failed_request(
    prompt_id: str, t0: float, error: str, latency_s: float | None = None
) -> RequestRecord:
    return RequestRecord(
        prompt_id=prompt_id,
        output_text="",
        completion_tokens=0,
        finish_reason=None,
        latency_s=time.monotonic() - t0 if latency_s is None else latency_s,
        error=error,
    )
