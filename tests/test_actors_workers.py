"""WorkerPool: bounded parallelism, idle exit, job failures, shutdown."""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest

from actors import WorkerPool, await_condition


def _alive_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "-")]


class Journal:
    """Thread-safe event log for ordering assertions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[str] = []

    def add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.events)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_runs_up_to_max_workers_jobs_at_the_same_time_and_the_next_waits(workers: int) -> None:
    pool = WorkerPool(workers, idle_seconds=5, name=f"par{workers}")
    journal = Journal()
    together = threading.Barrier(workers, timeout=5)  # breaks unless all N run at once
    gates = [threading.Event() for _ in range(workers)]
    broken: list[BaseException] = []

    def job(i: int) -> None:
        journal.add(f"start{i}")
        try:
            together.wait()
        except threading.BrokenBarrierError as exc:
            broken.append(exc)
            return
        journal.add(f"together{i}")
        assert gates[i].wait(10)
        journal.add(f"end{i}")

    extra_started = threading.Event()

    def extra() -> None:
        journal.add("start-extra")
        extra_started.set()

    try:
        for i in range(workers):
            pool.submit(functools.partial(job, i))
        await_condition(
            lambda: broken or sum(e.startswith("together") for e in journal.snapshot()) == workers,
            message="all N jobs past the barrier at once",
        )
        assert broken == []
        pool.submit(extra)  # the N+1th job
        assert pool.thread_count == workers  # capped: no extra thread for it
        assert not extra_started.is_set()
        gates[0].set()  # free one worker: the waiting job runs on it
        assert extra_started.wait(5)
        events = journal.snapshot()
        assert events.index("end0") < events.index("start-extra")
        assert pool.thread_count == workers
    finally:
        for gate in gates:
            gate.set()
        assert pool.shutdown(timeout=5)
    assert broken == []


def test_threads_exit_after_idle_seconds() -> None:
    pool = WorkerPool(3, idle_seconds=0.05, name="idle")
    gate = threading.Event()
    done = threading.Barrier(4, timeout=5)
    for _ in range(3):
        pool.submit(lambda: (gate.wait(5), done.wait()))
    assert pool.thread_count == 3
    gate.set()
    done.wait()
    await_condition(lambda: pool.thread_count == 0, message="idle workers to exit")
    await_condition(lambda: not _alive_threads("idle"), message="idle threads to be gone")
    pool.shutdown()


@pytest.mark.parametrize("backlog", [1, 3])
def test_a_pool_whose_threads_idled_out_still_runs_new_jobs(backlog: int) -> None:
    """Regression: jobs queued at the cap left stale idle tokens; once every thread idled out,
    a new submit took a token instead of spawning a thread and the job never ran."""
    pool = WorkerPool(1, idle_seconds=0.05, name="stale")
    gate = threading.Event()
    ran = threading.Semaphore(0)
    pool.submit(gate.wait)
    for _ in range(backlog):
        pool.submit(ran.release)  # queued behind the busy worker, at the cap
    gate.set()
    for _ in range(backlog):
        assert ran.acquire(timeout=5)
    await_condition(lambda: pool.thread_count == 0, message="the worker to idle out")
    later = threading.Event()
    pool.submit(later.set)
    assert later.wait(5), "a job submitted after the idle exit never ran"
    assert pool.shutdown(timeout=5)


def test_a_free_slot_is_used_while_another_worker_is_busy() -> None:
    """A stale idle token must not stand in for a thread: with one worker busy and the other
    idled out, a new job must get a thread of its own (it waits for the busy one otherwise)."""
    pool = WorkerPool(2, idle_seconds=0.05, name="slot")
    long_gate, short_gate = threading.Event(), threading.Event()
    quick_done = threading.Event()
    pool.submit(long_gate.wait)  # worker 1: busy until the end of the test
    pool.submit(short_gate.wait)  # worker 2
    pool.submit(quick_done.set)  # both busy: queued at the cap
    assert pool.thread_count == 2
    short_gate.set()
    assert quick_done.wait(5)
    await_condition(lambda: pool.thread_count == 1, message="worker 2 to idle out")
    ran = threading.Event()
    try:
        pool.submit(ran.set)
        assert ran.wait(5), "the job waited for the busy worker although a slot was free"
    finally:
        long_gate.set()
        assert pool.shutdown(timeout=5)


def test_an_idle_worker_is_reused_instead_of_spawning() -> None:
    pool = WorkerPool(4, idle_seconds=5, name="reuse")
    first = threading.Event()
    pool.submit(first.set)
    assert first.wait(5)
    await_condition(lambda: pool._idle == 1, message="the worker to wait for work")
    second = threading.Event()
    pool.submit(second.set)
    assert second.wait(5)
    assert pool.thread_count == 1
    assert pool.shutdown(timeout=5)


@pytest.mark.parametrize("error", [RuntimeError("job bug"), SystemExit(3), KeyboardInterrupt()])
def test_a_raising_job_does_not_kill_the_worker(error: BaseException, log_records: list[Any]) -> None:
    pool = WorkerPool(1, idle_seconds=5, name="raise")
    idents: list[int] = []

    def bad() -> None:
        idents.append(threading.get_ident())
        raise error

    after = threading.Event()

    def good() -> None:
        idents.append(threading.get_ident())
        after.set()

    pool.submit(bad)
    pool.submit(good)
    assert after.wait(5)
    assert len(idents) == 2
    assert idents[0] == idents[1]  # the same worker thread survived and ran the next job
    assert pool.thread_count == 1
    await_condition(
        lambda: any("worker job failed" in r["message"] for r in log_records), message="the failure to be logged"
    )
    assert pool.shutdown(timeout=5)


def test_submit_after_shutdown_raises() -> None:
    pool = WorkerPool(2, name="closed")
    pool.submit(lambda: None)
    assert pool.shutdown(timeout=5)
    with pytest.raises(RuntimeError, match="'closed' is shut down"):
        pool.submit(lambda: None)


def test_submit_after_shutdown_of_an_unused_pool_raises() -> None:
    pool = WorkerPool(2, name="unused")
    assert pool.shutdown(timeout=5)
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_shutdown_lets_queued_jobs_finish_and_joins_the_threads() -> None:
    pool = WorkerPool(2, idle_seconds=30, name="join")
    gate = threading.Event()
    finished: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        gate.wait(5)
        with lock:
            finished.append(i)

    for i in range(6):
        pool.submit(functools.partial(job, i))
    assert pool.thread_count == 2
    gate.set()
    assert pool.shutdown(timeout=5) is True
    assert sorted(finished) == list(range(6))
    assert pool.thread_count == 0
    assert not _alive_threads("join")


def test_shutdown_reports_threads_that_did_not_exit_in_time() -> None:
    pool = WorkerPool(1, name="stuck")
    gate = threading.Event()
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        gate.wait(10)

    pool.submit(stuck)
    assert entered.wait(5)
    try:
        assert pool.shutdown(timeout=0.05) is False
    finally:
        gate.set()
    assert pool.shutdown(timeout=5) is True
    assert not _alive_threads("stuck")


def test_a_shutdown_from_one_of_the_pools_own_jobs_does_not_join_its_own_thread() -> None:
    """Regression (acklost ``owner_stop2.py``): a job that shut its own pool down got ``RuntimeError: cannot join
    current thread``, which skipped whatever its caller had left to stop. Now that thread is not joined: the
    shutdown says not every thread exited (this one is still in its job), and the thread exits once it returns."""
    pool = WorkerPool(1, name="selfstop")
    answered: list[Any] = []
    done = threading.Event()

    def job() -> None:
        try:
            answered.append(pool.shutdown(timeout=5))
        except BaseException as exc:
            answered.append(exc)
        done.set()

    pool.submit(job)
    assert done.wait(10)
    assert answered == [False]
    assert pool.shutdown(timeout=5) is True
    assert not _alive_threads("selfstop")


def test_context_manager_shuts_down() -> None:
    ran = threading.Event()
    with WorkerPool(2, name="ctx") as pool:
        pool.submit(ran.set)
    assert ran.is_set()
    assert pool.thread_count == 0
    assert not _alive_threads("ctx")
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


@pytest.mark.parametrize("workers", [0, -1])
def test_max_workers_must_be_positive(workers: int) -> None:
    with pytest.raises(ValueError, match="max_workers must be >= 1"):
        WorkerPool(workers)


def test_many_jobs_all_run_with_few_workers() -> None:
    pool = WorkerPool(3, idle_seconds=0.05, name="many")
    count = [0]
    lock = threading.Lock()

    def job() -> None:
        with lock:
            count[0] += 1

    for _ in range(500):
        pool.submit(job)
        assert pool.thread_count <= 3
    await_condition(lambda: count[0] == 500, message="all jobs to run")
    await_condition(lambda: pool.thread_count == 0, message="idle exit")
    assert pool.shutdown(timeout=5)


@pytest.mark.parametrize("error", [RuntimeError("job bug"), SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
def test_a_raising_job_reports_its_error_to_on_error(error: BaseException) -> None:
    pool = WorkerPool(1, idle_seconds=5, name="report")
    reported: list[BaseException] = []
    done = threading.Event()

    def record(exc: BaseException) -> None:
        reported.append(exc)
        done.set()

    def bad() -> None:
        raise error

    pool.submit(bad, on_error=record)
    assert done.wait(10)
    assert reported == [error]
    assert pool.failed_jobs == 1
    assert pool.shutdown(timeout=5)


def test_a_failing_on_error_callback_is_logged_and_the_worker_survives(log_records: list[Any]) -> None:
    pool = WorkerPool(1, idle_seconds=5, name="report")
    after = threading.Event()

    def broken_callback(exc: BaseException) -> None:
        raise SystemExit("callback bug")

    def bad() -> None:
        raise RuntimeError("job bug")

    pool.submit(bad, on_error=broken_callback)
    pool.submit(after.set)
    assert after.wait(10)
    await_condition(
        lambda: any("on_error callback failed" in r["message"] for r in log_records), message="the callback failure"
    )
    assert pool.failed_jobs == 1
    assert pool.shutdown(timeout=5)


def test_a_job_that_succeeds_is_not_reported() -> None:
    pool = WorkerPool(1, idle_seconds=5, name="report")
    reported: list[BaseException] = []
    ran = threading.Event()
    pool.submit(ran.set, on_error=reported.append)
    assert ran.wait(10)
    assert pool.shutdown(timeout=5)
    assert reported == []
    assert pool.failed_jobs == 0


# ── a thread being started, or failing to start (review actorsfix2, finding 5) ──


class _HookedThread(threading.Thread):
    """A Thread whose start() runs ``hook`` first, for the pool's threads named ``prefix-…`` only."""

    prefix = ""
    hook: Any = None

    def start(self) -> None:
        if self.name.startswith(self.prefix + "-") and type(self).hook is not None:
            type(self).hook()
        super().start()


def test_shutdown_while_a_submit_is_starting_its_thread_neither_raises_nor_loses_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: submit() counted the new thread, then started it after releasing the lock; a shutdown() in
    between joined a thread never started and raised RuntimeError('cannot join thread before it is started').
    The hook runs that shutdown exactly in the gap."""
    pool = WorkerPool(2, idle_seconds=5, name="gap")
    answers: list[object] = []

    def shutdown_in_the_gap() -> None:
        try:
            answers.append(pool.shutdown(timeout=0))
        except RuntimeError as exc:
            answers.append(exc)

    hooked = type("GapThread", (_HookedThread,), {"prefix": "gap", "hook": staticmethod(shutdown_in_the_gap)})
    monkeypatch.setattr(threading, "Thread", hooked)
    ran = threading.Event()
    pool.submit(ran.set)
    monkeypatch.undo()
    assert answers == [False]  # not raised: the starting thread is not done yet
    assert ran.wait(5)  # a job queued before the shutdown is finished
    assert pool.shutdown(timeout=5)
    assert pool.thread_count == 0


def test_a_thread_that_cannot_start_frees_its_place_and_its_job_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a failing Thread.start() left the thread counted: a max_workers=1 pool never ran a job again."""
    pool = WorkerPool(1, idle_seconds=5, name="nostart")

    def cannot_start() -> None:
        raise RuntimeError("can't start new thread")

    hooked = type("NoStartThread", (_HookedThread,), {"prefix": "nostart", "hook": staticmethod(cannot_start)})
    monkeypatch.setattr(threading, "Thread", hooked)
    refused: list[str] = []
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(lambda: refused.append("ran"))
    monkeypatch.undo()
    assert pool.thread_count == 0
    ran = threading.Event()
    pool.submit(ran.set)
    assert ran.wait(5), "the pool is wedged: the thread that never started still holds its place"
    assert refused == []  # the refused job was not queued
    assert pool.shutdown(timeout=5)


def test_a_thread_that_cannot_start_beside_a_running_one_leaves_the_job_queued_for_it(
    monkeypatch: pytest.MonkeyPatch, log_records: list[Any]
) -> None:
    pool = WorkerPool(2, idle_seconds=5, name="onestart")
    release = threading.Event()
    busy = threading.Event()

    def blocker() -> None:
        busy.set()
        release.wait(5)

    pool.submit(blocker)
    assert busy.wait(5)

    def cannot_start() -> None:
        raise RuntimeError("can't start new thread")

    hooked = type("OneStartThread", (_HookedThread,), {"prefix": "onestart", "hook": staticmethod(cannot_start)})
    monkeypatch.setattr(threading, "Thread", hooked)
    ran = threading.Event()
    pool.submit(ran.set)  # accepted: the running worker takes it once free
    monkeypatch.undo()
    assert pool.thread_count == 1
    assert any("could not be started" in r["message"] for r in log_records)
    release.set()
    assert ran.wait(5)
    assert pool.shutdown(timeout=5)
