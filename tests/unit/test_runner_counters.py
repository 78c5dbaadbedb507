"""The runner's per-request counters when the engine logs them instead of returning
them (sglang before 0.5.13), and variant counters when metrics cannot be differenced."""

from __future__ import annotations

import json
from pathlib import Path

from farm.engines.sglang import SglangAdapter
from farm.records import RequestRecord, SpecCounters
from farm.runner.variants import counters_from_log, variant_counters

DATA = Path(__file__).parents[1] / "data" / "sglang"


def _request(prompt_id: str, counters: SpecCounters | None = None) -> RequestRecord:
    return RequestRecord(
        prompt_id=prompt_id,
        output_text="x",
        completion_tokens=28,
        finish_reason="stop",
        latency_s=0.1,
        counters=counters,
    )


def test_logged_counters_are_joined_by_response_id(tmp_path: Path) -> None:
    adapter = SglangAdapter()
    body = json.loads((DATA / "0.5.12.post1-chat.json").read_text())
    done = adapter.parse_completion(body)
    assert done.counters is None and done.request_id
    log = tmp_path / "cell.log"
    log.write_text((DATA / "0.5.12.post1-request-log.txt").read_text())
    records = [_request("p0"), _request("p1")]
    joined = counters_from_log(adapter, log, records, {"p0": done.request_id, "p1": "gone"})
    assert joined[0].counters is not None and joined[0].counters.accepted == 17
    assert joined[1].counters is None  # an id the log does not have stays unknown


def test_variant_counters_fall_back_to_the_sum_of_requests_only_without_metrics() -> None:
    a = SpecCounters(drafts=10, draft_tokens=30, accepted=17, accepted_per_pos=(8, 6, 3))
    b = SpecCounters(drafts=4, draft_tokens=12, accepted=5, accepted_per_pos=(3, 2))
    records = [_request("p0", a), _request("p1", b), _request("p2")]
    summed = variant_counters(SpecCounters(), records)
    assert summed == SpecCounters(
        drafts=14, draft_tokens=42, accepted=22, accepted_per_pos=(11, 8, 3)
    )
    metrics = SpecCounters(drafts=15, draft_tokens=45, accepted=23)
    assert variant_counters(metrics, records) == metrics
    assert variant_counters(SpecCounters(), [_request("p2")]) == SpecCounters()
