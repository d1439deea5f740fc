"""The engine thread: what it takes from the queue, which requests start, and whose step is next.

Several answers run together, each on its own sequence: in each turn the engine thread takes
one step of every answer being streamed (a token) and of one prompt being computed (a batch;
turns.py says which, and when a request waits for another's prompt), so one client's long
prompt does not hold another's stream for its whole length. Each request is still computed
in the batches it would get alone. Work for later (warm-ups, an answer's recompute) runs only
when no answer does, and an answer waits while a warm-up finishes (it is usually that answer's
own prefix) or a stopped request clears its sequence. The runner (runner.py) does the work of
each step; a request's phase (phases.py) says where it is.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable

from chatapp.engine.batch_rule import MAX_TOGETHER
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.phases import Phase
from chatapp.engine.requests import GenerationRequest
from chatapp.engine.runner import Runner, untouched_result
from chatapp.engine.tasks import Task
from chatapp.engine.turns import take_turns

log = logging.getLogger(__name__)

# Opens the runner on the engine thread (loading the model); given whether the running job is cancelled.
RunnerOpener = Callable[[Callable[[], bool]], Runner]


class Scheduler:
    """Owns the engine thread and its queue; thread-safe `submit`, `flush` and `close`."""

    def __init__(self, open_runner: RunnerOpener) -> None:
        self._open_runner = open_runner
        self._jobs: queue.Queue[GenerationHandle | threading.Event | None] = queue.Queue()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stepping: Task | None = None  # the task whose step runs now (for the abort check and close)
        self._closing = False
        self._closing_lock = threading.Lock()  # also guards the two fields below
        self._waiting_requests = 0  # generation requests submitted and not yet started by the engine thread
        self._own_job: GenerationHandle | None = None  # the answer recompute running now, if any
        self._own_job_deferrable = False  # whether it is a restore check, which a flush gives up
        self._flushing = 0  # flush() calls waiting that give up restore checks
        # Engine thread only.
        self._tasks: list[Task] = []  # requests started and not yet done, in turn order
        self._pending: deque[Task] = deque()  # taken from the queue, not yet started (Phase.PENDING)
        self._barriers: list[tuple[threading.Event, set[int]]] = []  # flush() waits: ids of requests ahead
        self._thread = threading.Thread(target=self._run, name="chatapp-engine", daemon=True)

    def start(self) -> BaseException | None:
        """Start the engine thread and wait until it has opened the runner; the error if it could not."""
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
        return self._start_error

    # Any thread.
    def submit(self, handle: GenerationHandle) -> None:
        with self._closing_lock:
            if self._closing:
                raise RuntimeError("the engine is closed")
            self._waiting_requests += 1
            self._jobs.put(handle)
            own_job = self._own_job
        if own_job is not None:
            own_job.cancel()  # a request comes before the recompute of the last answer

    def flush(self, *, checks: bool = False) -> bool:
        """Wait until every request submitted so far is done, own work included; False once closing.

        A restore check (work for idle time that may take a whole prompt's compute) is given up, its
        prompt kept for later, unless `checks`: a server or app closing waits for stores, not for it.
        """
        reached = threading.Event()
        with self._closing_lock:
            if self._closing:
                return False
            self._jobs.put(reached)
            if not checks:
                self._flushing += 1
                if self._own_job is not None and self._own_job_deferrable:
                    self._own_job.cancel()
        try:
            reached.wait()
        finally:
            if not checks:
                with self._closing_lock:
                    self._flushing -= 1
        return True

    def close(self) -> None:
        """Cancel what is running or queued, and wait for the engine thread to end."""
        with self._closing_lock:
            if self._closing:
                return
            self._closing = True
            self._jobs.put(None)
        stepping = self._stepping
        if stepping is not None:
            stepping.current.cancel()
        self._thread.join()

    def computing(self) -> bool:
        """Whether requests are being computed (a hint read from any thread: the cache's writer paces itself)."""
        return bool(self._tasks) or self._stepping is not None

    def stepping_cancelled(self) -> bool:
        """Whether the job running now was cancelled (llama.cpp asks during a long decode)."""
        stepping = self._stepping
        return stepping is not None and stepping.current.cancel_event.is_set()

    # The runner's own work (OwnWork).
    def begin_own_work(self, job: GenerationHandle, *, deferrable: bool = False) -> None:
        with self._closing_lock:
            self._own_job = job
            self._own_job_deferrable = deferrable
            if self._waiting_requests or self._closing or len(self._tasks) > 1 or (deferrable and self._flushing):
                job.cancel()

    def end_own_work(self) -> None:
        with self._closing_lock:
            self._own_job = None
            self._own_job_deferrable = False

    # Engine thread.
    def _run(self) -> None:
        try:
            runner = self._open_runner(self.stepping_cancelled)  # takes its own turns on the device
        except BaseException as error:  # reported to start()'s caller
            self._start_error = error
            self._started.set()
            return
        self._started.set()
        try:
            closing = False
            while not closing or self._tasks:
                if not closing:
                    closing = not self._take_jobs(runner, block=not self._tasks and not self._pending)
                if closing:
                    self._end_pending()
                    for task in self._tasks:
                        task.current.cancel()
                with runner.device_step():
                    self._start_tasks(runner)
                    self._step_tasks(runner)
        except BaseException as error:  # a bug: no caller may wait for ever on a dead engine
            log.exception("the engine thread failed")
            self._fail_everything(error)
        finally:
            runner.close()  # the cache's writes first, then the device's turn to free the model

    def _take_jobs(self, runner: Runner, *, block: bool) -> bool:
        """Move what was submitted into `_pending` (waiting for one when `block`); False once closing."""
        job: GenerationHandle | threading.Event | None
        try:
            job = self._jobs.get(block=block)
        except queue.Empty:
            return True
        while True:
            if job is None:
                return False
            if isinstance(job, threading.Event):  # a flush() barrier: it waits for every request ahead
                ahead = {id(task.handle) for task in (*self._tasks, *self._pending)}
                self._barriers.append((job, ahead))
                self._release_barriers()
            else:
                # Its prompt's KV goes to the cache, and it may wait for another's (not without a cache).
                shares_prompt = job.request.use_cache and job.request.store and runner.cache is not None
                self._pending.append(Task(job, shares_prompt=shares_prompt))
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return True

    def _fail_everything(self, error: BaseException) -> None:
        """The engine thread is ending on a bug: refuse new requests, end every one held, release every wait."""
        with self._closing_lock:
            self._closing = True
        handles = [task.handle for task in (*self._tasks, *self._pending)]
        while True:  # what was submitted and not yet taken
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, GenerationHandle):
                handles.append(job)
            elif isinstance(job, threading.Event):
                job.set()
        for handle in handles:
            if not handle.done:
                handle.finish(None, error)
        self._tasks.clear()
        self._pending.clear()
        for barrier, _ in self._barriers:
            barrier.set()
        self._barriers.clear()

    def _end_pending(self) -> None:
        """Closing: what never started ends at once, as cancelled."""
        while self._pending:
            task = self._pending.popleft()
            task.handle.cancel()
            self._end_untouched(task)

    def _end_untouched(self, task: Task) -> None:
        """A request that never started ends, cancelled, touching no sequence."""
        with self._closing_lock:
            self._waiting_requests -= 1
        task.handle.finish(untouched_result(task.handle))
        task.phase = Phase.DONE
        self._task_done(task.handle)

    def _start_tasks(self, runner: Runner) -> None:
        """Start the waiting requests that may run now, in the order they came.

        One cancelled while it waited ends at once, wherever it is in the queue: it touches no
        sequence, and must not hold up the others (nor count as a request waiting).
        """
        for task in [task for task in self._pending if task.handle.cancel_event.is_set()]:
            self._pending.remove(task)
            self._end_untouched(task)
        while self._pending and self._may_start(runner, self._pending[0].handle.request):
            task = self._pending.popleft()
            with self._closing_lock:
                self._waiting_requests -= 1
            request = task.handle.request
            if request.sequence is not None:
                runner.sequences[request.sequence].holder = task.handle  # no other request may take it now
            task.phase = Phase.WAITING
            task.steps = runner.serve(task)
            self._tasks.append(task)

    def _may_start(self, runner: Runner, request: GenerationRequest) -> bool:
        """Whether `request` may start beside the running tasks (see the module docstring)."""
        if not self._tasks:
            return True
        if len(self._tasks) >= len(runner.sequences) or request.prefill_only:
            return False  # a warm-up is work for when no answer runs
        named = runner.sequences[request.sequence] if request.sequence is not None else None
        ready = True
        for task in self._tasks:
            if task.phase.answered:
                task.current.cancel()  # an answer's recompute gives way to a request, as when it arrives
                ready = False
            elif task.handle.request.prefill_only or task.current.cancel_event.is_set():
                ready = False  # a warm-up finishing (likely this request's prefix), or a stop clearing its sequence
            elif named is not None and (not task.phase.placed or named.holder is task.handle):
                ready = False  # that sequence is in use, or may be once this task is placed
        return ready

    def _step_tasks(self, runner: Runner) -> None:
        """One step of each task whose turn it is (see turns.py); a cancelled one ends at once.

        An answer's step hands out a token (AnswerToken) for the next turn to evaluate. Where the
        model batches exactly (batch_rule.py), the tokens of every answer in this turn are evaluated
        in one decode at the turn's end, then each of those tasks samples its next; elsewhere
        each is evaluated alone just before its task's step, as one request alone always is.
        """
        stopping = [task for task in self._tasks if task.current.cancel_event.is_set()]
        running = [task for task in self._tasks if task not in stopping]
        chosen = {id(state) for state in take_turns([task.turn for task in running], runner.context.shape.n_batch)}
        stepping = [task for task in self._tasks if task in stopping or id(task.turn) in chosen]
        answering = [task for task in stepping if task.pending is not None and task not in stopping]
        together = runner.batches_answers and len(answering) > 1
        for task in stepping:
            if together and task in answering:
                continue  # evaluated with the others below
            if task.pending is not None and task not in stopping and not self._evaluate(runner, task, [task]):
                continue
            self._step(runner, task)
        for start in range(0, len(answering) if together else 0, MAX_TOGETHER):
            group = answering[start : start + MAX_TOGETHER]
            if self._evaluate(runner, None, group):
                for task in group:
                    self._step(runner, task)

    def _evaluate(self, runner: Runner, task: Task | None, tasks: list[Task]) -> bool:
        """Evaluate the pending tokens of `tasks`; a failure ends each of them as a failed step would."""
        pending = [waiting.pending for waiting in tasks if waiting.pending is not None]
        self._stepping = task
        try:
            runner.evaluate_answers(pending)
        except Exception as error:  # thrown into each request's steps: it forgets its sequence and fails
            for failed in tasks:
                self._step(runner, failed, error)
            return False
        finally:
            self._stepping = None
        return True

    def _step(self, runner: Runner, task: Task, error: Exception | None = None) -> None:
        """Resume the task to its next yield (with `error` raised at the one it stopped at)."""
        task.pending = None
        self._stepping = task
        try:
            task.pending = next(task.steps) if error is None else task.steps.throw(error)
        except StopIteration:
            self._end_task(runner, task)
        except BaseException as failure:  # serve handles its own failures: this is a bug, not a request's end
            log.exception("engine task failed")
            for live in runner.sequences.held_by(task.handle):
                runner.placer.forget(live.index)
            if not task.handle.done:
                task.handle.finish(None, failure)
            self._end_task(runner, task)
        finally:
            self._stepping = None

    def _end_task(self, runner: Runner, task: Task) -> None:
        self._tasks.remove(task)
        task.phase = Phase.DONE
        runner.sequences.release(task.handle)
        self._task_done(task.handle)

    def _task_done(self, handle: GenerationHandle) -> None:
        for _, ahead in self._barriers:
            ahead.discard(id(handle))
        self._release_barriers()

    def _release_barriers(self) -> None:
        for barrier, ahead in list(self._barriers):
            if not ahead:
                barrier.set()
                self._barriers.remove((barrier, ahead))
