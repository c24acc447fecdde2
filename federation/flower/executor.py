"""The hospital's own executor: only the installed gastric-fl hospital code answers a run's messages.

docs/design.md, "Trust model": a hospital runs only the gastric-fl code installed on its machine, never code a run
carries. A Flower 1.41 SuperNode in its default ``--isolation subprocess`` mode starts ``flwr-clientapp`` for every
message, which installs the run's app bundle (FAB) and imports its ClientApp: whoever can submit a run can run code
at every hospital (../shared/reference/flower-1.41.md, "Trust, isolation and speed"). Here the SuperNode runs with
``--isolation process`` and this module is the process that executes its tasks, talking to the SuperNode's runtime
API on 127.0.0.1 as Flower's own ``flwr-clientapp`` does (``flwr.supernode.runtime.run_clientapp``: acquire a task,
pull its message and context, push the reply and the task's status), but it never installs or imports the FAB:

- a run whose app is not ``APP_ID`` (the FAB of ``federation/flower/fab``) is answered with an error that says
  so, and nothing of it is installed, imported or run; that refusal is recorded in the hospital's outbound log
  (``federation.hospital.outbound.record_reply``, the log named by the node's ``hospital-dir``) before it leaves,
  like every other reply, so ``gastric-fl federation audit`` counts it;
- every other message is answered by ``federation.hospital.handler.Hospital`` from the node's own configuration
  (``--node-config``: dataset, folder, policy); the run's configuration is never read, so a run cannot point the
  hospital at another folder or dataset;
- the hospital stays loaded between messages (its code, torch, its tiles and its model: ``Hospital`` keeps them),
  while its state is still checkpointed after every round, so resume and a killed hospital behave as before.

The runtime API is protected with Flower's SuperExec shared secret (``--superexec-auth-secret-file``, a file of
random bytes, 0600, in the hospital's state), so another local user cannot take the hospital's tasks.

Run as ``python -m federation.flower.executor --runtime 127.0.0.1:PORT --secret-file FILE -- flower-supernode ...``:
it starts the SuperNode as its child in its own process group (stopped together), serves its tasks until the
SuperNode exits, and exits with the SuperNode's code. The runtime API is internal to Flower: pinned by
``flwr>=1.41,<1.42`` and exercised by the deployment tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import federation  # noqa: F401  (no update checks, no telemetry: federation.OFFLINE_ENV)
from federation.flower.waits import waits
from infra import parent_death

if TYPE_CHECKING:
    from flwr.app import Context, Message

APP_ID = "gastric-fl/gastric-fl-federation"  # publisher/name of federation/flower/fab/pyproject.toml
AUTH_METHODS = frozenset({"/flwr.proto.Runtime/AcquireTask"})  # what Flower's own SuperExec authenticates
PULL_SECONDS = 120.0  # at most, to pull one message's content: a stale task (its run ended) must not hold the hospital
REFUSED = "refused by the hospital"
# what flower-supernode prints when the SuperLink refuses its key (Flower exit code 305; its process exits 1)
REFUSED_LINE = "Failed to activate SuperNode"
REFUSED_EXIT = 75  # the executor's exit code when the SuperLink refused its SuperNode (EX_TEMPFAIL: may pass)


def _log(text: str) -> None:
    print(f"[gastric-fl executor] {text}", file=sys.stderr, flush=True)


def bounded_retry(max_time: float) -> Any:
    """Retries of calls to the SuperNode's local runtime API for at most ``max_time`` seconds, giving up at once on
    a refusal (4xx). Not Flower's ``make_simple_http_retry_invoker``: it retries forever, and on a 401 it sends
    SIGINT to its own process, which would stop the whole hospital over one stale task."""
    import httpx
    from flwr.supercore.retry import RetryInvoker, exponential

    def give_up(exc: Exception) -> bool:
        return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(max_delay=2),
        recoverable_exceptions=(httpx.TransportError, httpx.HTTPStatusError),
        max_tries=None,
        max_time=max_time,
        should_giveup=give_up,
    )


def runtime_client(address: str, interceptors: list[Any], *, max_time: float) -> Any:
    """A client of the SuperNode's runtime API on 127.0.0.1 (plain HTTP: it never leaves the machine; the shared
    secret or the task's token authenticates the caller), its calls retried for at most ``max_time`` seconds."""
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=interceptors,
        retry_invoker=bounded_retry(max_time),
    )


class HospitalExecutor:
    """Acquires the SuperNode's ClientApp tasks and answers each with the installed hospital code."""

    def __init__(self, address: str, secret: bytes) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor

        from federation.hospital.handler import Hospital, Site

        self.address = address
        self.client = runtime_client(
            address,
            [
                RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods=AUTH_METHODS),
            ],
            max_time=5.0,
        )
        self.hospitals: dict[Site, Hospital] = {}  # warm: one per site, kept between messages

    def serve(self, alive: Callable[[], bool]) -> None:
        """Acquire and run tasks while ``alive()``."""
        import httpx
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        request = AcquireTaskRequest(supported_task_types=[str(TaskType.CLIENT_APP)], agentapp_fab_hashes=[])
        # between two empty task requests: short after a task, growing while none comes (federation.flower.waits);
        # the SuperNode itself fetches messages only every 3 s when idle, so asking it more often only costs CPU
        delays = waits()
        while alive():
            try:
                response = self.client.AcquireTask(request)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403):
                    _log(f"the SuperNode refused this executor ({exc.response.status_code}): check its secret file")
                time.sleep(0.5)  # the SuperNode is not serving yet, or restarting
                continue
            except Exception as exc:  # anything else from the runtime API: say so, keep serving
                _log(f"could not ask the SuperNode for a task: {type(exc).__name__}: {exc}")
                time.sleep(1.0)
                continue
            if response.HasField("task") and response.token:
                self.run_task(response.token)
                delays = waits()  # a round's next message (e.g. its evaluation) may follow at once
            else:
                time.sleep(next(delays))

    def run_task(self, token: str) -> None:
        """One task: pull its message, answer it, push the reply and the task's final status."""
        from flwr.common.constant import SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        runtime = runtime_client(
            self.address,
            [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)],
            max_time=120.0,
        )
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(runtime))
        heartbeat.start()
        context = None
        status, details = SubStatus.FAILED, "the hospital executor failed"
        try:
            message, context, run = self.pull_task_input(runtime)  # the FAB is never read, let alone installed
            reply = self.reply(message, context, run.fab_id)
            push_message(runtime, reply, context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as exc:  # one task's trouble never stops the hospital
            details = f"{type(exc).__name__}: {exc}"
            _log(f"task failed: {details}")
        finally:
            try:
                push_task_output(client=runtime, context=context, sub_status=status, details=details)
            except Exception as exc:  # the task is gone (its run finished, the SuperNode restarted): move on
                _log(f"could not report the task's end: {type(exc).__name__}: {exc}")
            finally:
                if heartbeat.is_running:
                    heartbeat.stop()
                runtime.close()

    @staticmethod
    def pull_task_input(client: Any) -> tuple[Message, Context, Any]:
        """The task's message, context and run, as Flower's ``run_clientapp.pull_task_input`` pulls them, but with
        the message's content pulled for at most ``PULL_SECONDS`` (Flower's own waits for hours, and a task whose
        run ended while the server was down would hold this one executor, and so the hospital, all that time);
        the FAB that comes with the task is not even read."""
        from flwr.app import Message
        from flwr.common.serde import context_from_proto, run_from_proto
        from flwr.proto.node_pb2 import Node
        from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
        from flwr.supercore.inflatable.inflatable_protobuf_utils import (
            make_confirm_message_received_fn_protobuf,
            make_pull_object_fn_protobuf,
        )
        from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
        from flwr.supercore.task_identity import TaskIdentity

        res = client.PullTaskInput(PullTaskInputRequest())
        TaskIdentity.task_id = res.task_id
        TaskIdentity.run_id = res.run.run_id
        TaskIdentity.node_id = res.context.node_id
        context = context_from_proto(res.context)
        run = run_from_proto(res.run)
        pulled = client.PullMessages(PullAppMessagesRequest())
        if not pulled.messages_list:
            raise RuntimeError("no message came with the task")
        node = Node(node_id=context.node_id)
        tree = pulled.message_object_trees[0]
        message = pull_and_inflate_object_from_tree(
            tree,
            make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
            make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
            return_type=Message,
            max_time=PULL_SECONDS,
        )
        message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's own ClientApp process sets it
        return message, context, run

    def reply(self, message: Message, context: Context, fab_id: str) -> Message:
        """The reply to one message: a refusal for another app, else the hospital's own answer."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode

        from federation.flower.hospital_app import hospital_site
        from federation.flower.records import from_record, to_record
        from federation.hospital.handler import Hospital

        if fab_id != APP_ID:
            reason = (
                f"{REFUSED}: the run carries the app {fab_id!r}; this hospital answers only with its installed "
                f"gastric-fl hospital ({APP_ID}); nothing of the run's app was installed or run"
            )
            _log(reason)
            reason = record_refusal(context, message.metadata.message_type, fab_id, reason)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
        try:
            site = hospital_site(context.node_config, {})  # the node's own settings; the run's are never read
        except Exception as exc:
            reason = f"{REFUSED}: its node configuration is unusable ({exc})"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
        hospital = self.hospitals.get(site)
        if hospital is None:
            hospital = self.hospitals[site] = Hospital(site)
        envelope = hospital.answer(from_record(message.content))
        return Message(to_record(envelope), reply_to=message)


def record_refusal(context: Context, asked: str, fab_id: str, reason: str) -> str:
    """Record the refusal of a foreign app's message in the outbound log of the hospital the node's own
    configuration names, before it leaves (as ``Hospital.answer`` records every reply): a ``Failure`` with
    ``reason``, of run ``flower run <id> (<app>)``. The log is the hospital's (``Site.outbound_log``: in its
    ``hospital-dir``) even where the rest of the node's configuration (its dataset, its policy) is unusable. Returns
    the reason to send; where the log cannot be written (or the node names no ``hospital-dir``) the refusal still
    leaves, since it carries nothing of the hospital, and the executor's output says that it is not in the log."""
    from federation.errors import first_line
    from federation.flower.hospital_app import hospital_site
    from federation.hospital.handler import Site
    from federation.hospital.outbound import record_reply
    from federation.wire.codec import encode
    from federation.wire.contract import Failure

    config = context.node_config
    try:
        try:
            site = hospital_site(config, {})  # the node's own settings; the run's are never read
        except Exception:
            if "hospital-dir" not in config:
                raise
            hospital = int(config.get("client", config.get("partition-id", -1)))
            site = Site(Path(), hospital, Path(str(config["hospital-dir"])))
        request = {"run_id": f"flower run {context.run_id} ({fab_id})", "kind": asked}
        record_reply(site.outbound_log, request, encode(Failure(site.hospital, reason)))
    except Exception as exc:  # the refusal leaves all the same: it holds nothing of the hospital
        _log(f"this refusal is not in the outbound log: {type(exc).__name__}: {first_line(exc)}")
    return reason


def main(argv: Sequence[str] | None = None) -> int:
    """Start the SuperNode given after ``--`` as a child, serve its tasks, exit with its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        print(
            "usage: python -m federation.flower.executor --runtime HOST:PORT --secret-file FILE -- "
            "flower-supernode ...",
            file=sys.stderr,
        )
        return 2
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m federation.flower.executor")
    parser.add_argument("--runtime", required=True)
    parser.add_argument("--secret-file", required=True)
    options = parser.parse_args(args[:split])
    supernode = args[split + 1 :]
    try:
        with open(options.secret_file, "rb") as handle:
            secret = handle.read()
    except OSError as exc:
        print(f"cannot read {options.secret_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    # same process group: stopped with us. Its output passes through here, so that a refusal can be explained.
    # It ends with us, however we end (infra.parent_death): a SIGKILL here must not leave it answering the server.
    child = subprocess.Popen(
        parent_death.wrapped(supernode), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seen: list[str] = []

    def relay() -> None:
        if child.stdout is None:
            return
        for raw in iter(child.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if REFUSED_LINE in line:
                seen.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    relaying = threading.Thread(target=relay, daemon=True)
    relaying.start()

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        HospitalExecutor(options.runtime, secret).serve(lambda: child.poll() is None)
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    code = child.wait() if child.returncode is None else child.returncode
    relaying.join(timeout=5)
    if seen:
        _log(
            "the SuperLink refused this hospital (Flower exit code 305): it still counts an earlier start of this "
            "hospital online (for about a minute after a crash or a stop, until its heartbeats expire), or its key is "
            "not registered there or was replaced (a rotated kit), or TLS failed; if it persists, ask the server's "
            "operator to register this hospital's supernode.pub (gastric-fl federation server does it for every kit "
            "hospital at start), and check the bundle's ca.crt and address"
        )
        return REFUSED_EXIT
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
