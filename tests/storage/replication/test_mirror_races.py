"""I6 under races: a mirror step against concurrent steps, source changes and a promotion, each
placed at an exact point of the step (an adversarial review found the first four)."""

from __future__ import annotations

import threading

from icelog.storage.core.commit import commit
from icelog.storage.errors import MirrorPromoted
from icelog.storage.groups.offsets import commit_offsets, committed_offsets
from icelog.storage.log.maintenance import Retention
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import init_producer
from icelog.storage.replication.mirror import copy_files, mirror, promote
from tests.support.mirror import PRINCIPAL, assert_parity, mirror_threads, race_once, rows, run_mirror


def test_i6_retention_after_the_step_read_the_target_is_not_a_gap(source_spec, target_spec, target, monkeypatch):
    """A step reads the target (log end 2). Before it reads the source, another step mirrors
    up to 8 and the source's retention moves its log start to 6. Nothing is missing from the
    target (it holds [0, 8)), yet the stale step compares the source's start 6 with the target
    end 2 it read first."""
    source = source_spec.open()
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(2)})
    run_mirror(source, target)

    def race():
        for i in range(3):
            src.append({0: rows(2, f"r{i}")})
        done = mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL)
        commit(source, "logs.orders", Retention("logs.orders", retention_bytes=1))
        return done

    # After the step's read of the target's group offsets (the target itself was read just before).
    raced = race_once(monkeypatch, "_target_groups", race)
    run_mirror(source, target)  # raised MirrorGap (partition 0, [2, 6)) before it re-checked the target
    assert raced and raced[0].log_ends == {0: 8}
    assert_parity(source, target)


def _stale_step_lands_while_call_plans(source_spec, target_spec, change_source):
    """B plans (reads source), then ``change_source()`` runs, then call A starts and plans;
    B's commit lands between A's plan and A's commit. Returns A's result."""
    b_planned, a_planned, b_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def b_copier(pairs):
        copy_files(pairs)
        b_planned.set()
        assert a_planned.wait(60)

    def run_b():
        try:
            mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL, copier=b_copier, max_attempts=1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            b_planned.set()
            b_done.set()

    def a_copier(pairs):
        copy_files(pairs)
        if not a_planned.is_set():
            a_planned.set()
            assert b_done.wait(60)

    b = threading.Thread(target=run_b)
    b.start()
    assert b_planned.wait(60)
    change_source()
    result = mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL, copier=a_copier)
    a_planned.set()
    b.join(60)
    assert not errors, errors
    return result


def test_i6_a_call_that_loses_to_a_stale_step_still_mirrors_group_offsets_committed_before_it(source_spec, target_spec, target):
    """A group commits offset 5 on the source, then ``mirror()`` is called. A concurrent step
    that read the source before that group commit lands first; the call's commit gets
    PlanOutdated; it must plan again (it once returned ``up_to_date`` because the target's log
    ends reached its goal, without the group offset committed before the call began)."""
    source = source_spec.open()
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(10)})
    run_mirror(source, target)
    src.append({0: rows(2, "late")})  # something for both steps to copy
    result = _stale_step_lands_while_call_plans(
        source_spec, target_spec, lambda: commit_offsets(source, "workers", {("orders", 0): 5})
    )
    assert result.groups == 1
    assert committed_offsets(target, "workers", "orders") == {0: 5}


def test_i6_a_call_that_loses_to_a_stale_step_still_mirrors_a_producer_initialised_before_it(source_spec, target_spec, target):
    source = source_spec.open()
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(10)})
    run_mirror(source, target)
    src.append({0: rows(2, "late")})
    _stale_step_lands_while_call_plans(source_spec, target_spec, lambda: init_producer(source, "logs.orders", "writer"))
    assert set(LogTable.open(target, "orders").state().producers) == set(src.state().producers)


def test_i6_a_promotion_between_plan_and_commit_refuses_the_step(source, target, monkeypatch):
    """A step plans; the target is promoted and its new owner initialises a producer (bumping
    the epoch of a producer the source also knows); the stale step's commit must not land on
    the promoted table (it would replace the producer state with the source's)."""
    src = LogTable.create(source, "orders", 1)
    me = init_producer(source, "logs.orders", "writer")
    src.append({0: rows(2)})
    run_mirror(source, target)
    init_producer(source, "logs.orders", "other")  # a change for the step to mirror
    bumped = []

    def race():
        promote(target, "orders")
        bumped.append(init_producer(target, "logs.orders", "writer"))  # the new primary fences the old epoch

    race_once(monkeypatch, "commit_tables", race, before=True)
    before = LogTable.open(target, "orders").table().metadata.properties["icelog.producers"]
    raised = None
    try:
        run_mirror(source, target)
    except MirrorPromoted as e:
        raised = e
    after = LogTable.open(target, "orders").state().producers
    assert bumped[0].epoch > me.epoch
    # The stale step's commit once landed on the promoted table and replaced its producer
    # state with the source's: the new owner's epoch bump was gone (a fenced zombie accepted).
    assert after[str(bumped[0].producer_id)].epoch == bumped[0].epoch, (before, dict(after))
    assert isinstance(raised, MirrorPromoted)


def test_i6_first_steps_create_the_target_concurrently(source_spec, target_spec, target):
    source = source_spec.open()
    src = LogTable.create(source, "orders", 2)
    for i in range(3):
        src.append({0: rows(2, f"a{i}"), 1: rows(1, f"b{i}")})
    commit_offsets(source, "g", {("orders", 0): 3})
    barrier = threading.Barrier(3)
    mirror_threads(source_spec, target_spec, 3, lambda steps: steps < 1, before=lambda: barrier.wait(30))(120)
    assert_parity(source, target)
    assert committed_offsets(target, "g", "orders") == {0: 3}


def test_i6_mirror_loops_beside_appends_group_commits_and_producer_inits_end_in_parity(source_spec, target_spec, target):
    """Three mirror loops into one target while the source appends, inits producers, commits
    group offsets: no step raises, the end state is in parity."""
    source = source_spec.open()
    src = LogTable.create(source, "orders", 2)
    src.append({0: rows(2), 1: rows(2)})
    run_mirror(source, target)
    stop = threading.Event()
    join = mirror_threads(source_spec, target_spec, 3, lambda steps: not stop.is_set())
    try:
        for i in range(12):
            src.append({i % 2: rows(2, f"c{i}")})
            commit_offsets(source, "g", {("orders", i % 2): src.watermarks()[i % 2].end - 1})
            if i % 4 == 3:
                init_producer(source, "logs.orders", f"p{i}")
    finally:
        stop.set()
    join()
    run_mirror(source, target)
    assert_parity(source, target)
    assert committed_offsets(target, "g", "orders") == committed_offsets(source, "g", "orders")


def test_i6_a_groups_only_call_that_loses_to_a_state_only_step_still_mirrors_its_groups(
    source_spec, target_spec, target, monkeypatch
):
    """No new data at all (so the old code never hit InvalidProduceOffset here): a scheduled
    step B plans a state-only change (a producer init); then a group commits offset 5 and the
    failover drill calls ``mirror()``. B lands between A's plan and A's commit: A's commit gets
    PlanOutdated (progress changed); it must plan again and write the group offset it read."""
    import icelog.storage.replication.mirror as mirror_module

    source = source_spec.open()
    src = LogTable.create(source, "orders", 1)
    src.append({0: rows(10)})
    run_mirror(source, target)
    init_producer(source, "logs.orders", "writer")  # B's state-only change
    real = mirror_module.commit_tables
    b_planned, a_planned, b_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def gated(*args, **kwargs):
        if threading.current_thread().name == "B":
            b_planned.set()
            assert a_planned.wait(60)
        elif not a_planned.is_set():
            a_planned.set()
            assert b_done.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(mirror_module, "commit_tables", gated)

    def run_b():
        try:
            mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL, max_attempts=1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            b_planned.set()
            b_done.set()

    b = threading.Thread(target=run_b, name="B")
    b.start()
    assert b_planned.wait(60)
    commit_offsets(source, "workers", {("orders", 0): 5})
    result = mirror(source_spec.open(), "orders", target_spec.open(), principal=PRINCIPAL)
    a_planned.set()
    b.join(60)
    assert not errors, errors
    assert result.groups == 1
    assert committed_offsets(target, "workers", "orders") == {0: 5}
