#!/usr/bin/env python3
"""An autosharding (gRFC A119) client written in Python with grpcio, for steady's server.

It follows one target as the protocol asks of a client: the first message is
`initial_client_config` (target, a uuid kept across reconnections, the newest generation
it holds); nothing else is sent before the server's `LoadReportingConfig`; chunks are
gathered until an `AssignmentMetadata` closes them into an assignment (the endpoint list
is every chunk's, in chunk order; the slices every chunk's, in any order), which is
validated and acknowledged, accepted or not:

* the generation must be above every generation accepted before (else refused);
* a slice needs start < end (an unset end: through the largest key), keys of at most
  512 bytes, endpoint indices inside the endpoint list, and no overlap with a slice
  starting before it; a slice breaking a rule is dropped;
* the gaps left (before, between and after the slices) are filled with slices of no
  endpoint, so the assignment covers every key; with no slice left it is refused;
* the ack's `error_message` names what was dropped or filled (at most 512 characters).

With `--loads`, it reports load every `load_reporting_interval`: the given per-key load
as ranges under the quantum and resolution the server set (load_ranges.py), the
interval running from the previous report's end (on any stream) to now.

Output: one JSON object per line on stdout: `stream` (each stream opened), `config`,
`assignment` (generation, chunk count, accepted, error_message, endpoints, slices as
validated), `report` (each sent), `status` (how a stream ended), `violation` (the
server broke a rule), `done` (the asked-for counts reached), `released` and last
`exit`. It gives up after `--deadline` seconds (`timeout`, exit code 3).

Standard input steers it, one command a line: `reconnect` leaves the stream and opens
another (with the newest generation accepted); the end of input, with `--stay`, ends
the run. With `--stay` it does not leave when done but keeps the stream (still acking)
until its input closes: an ack is never answered, so only the test, watching the
server, knows when the server has read it.
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_ranges  # noqa: E402
import stubs  # noqa: E402

MAX_KEY_BYTES = 512
MAX_MESSAGE_CHARS = 512
MAX_CHUNKS = 100_000


def emit(event, **fields):
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def field_of(message):
    """The one field set ("exactly one field is set"; the .proto declares no oneof)."""
    fields = [f.name for f, _ in message.ListFields()]
    if len(fields) > 1:
        return "several: " + ",".join(fields)
    return fields[0] if fields else None


def read_commands(signals):
    """Puts each line of standard input on the asyncio queue `signals`, then "eof"; read
    on a daemon thread, which never holds the process back."""
    loop = asyncio.get_running_loop()

    def put(item):
        try:
            loop.call_soon_threadsafe(signals.put_nowait, item)
        except RuntimeError:  # the loop is gone: the process is ending anyway
            pass

    def read():
        for line in sys.stdin:
            if line.strip():
                put(line.strip())
        put("eof")

    threading.Thread(target=read, daemon=True).start()


def seconds(pb_duration):
    return pb_duration.seconds + pb_duration.nanos / 1e9


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto", required=True, help="autosharding.proto")
    parser.add_argument("--server", required=True, help="host:port")
    parser.add_argument("--target", required=True)
    parser.add_argument("--uuid", default=str(uuid.uuid4()))
    parser.add_argument("--latest-generation", type=int, default=0)
    parser.add_argument("--assignments", type=int, default=1, help="done after this many assignments")
    parser.add_argument("--reports", type=int, default=0, help="done after this many load reports")
    parser.add_argument("--reject-first", action="store_true", help="refuse the first assignment")
    parser.add_argument("--loads", default="{}", help='per-key load per interval: {"<hex key>": load}')
    parser.add_argument("--metric", default="requests")
    parser.add_argument("--min-interval", type=float, default=0.05, help="floor on the reporting interval (s)")
    parser.add_argument(
        "--stay",
        action="store_true",
        help="once done, keep the stream (still acking) until standard input closes",
    )
    parser.add_argument("--deadline", type=float, default=120.0)
    return parser.parse_args()


def reassemble(chunks, generation, accepted_before):
    """Validates one assignment. Returns (accepted, message, endpoints, slices)."""
    endpoints = [e.endpoint for chunk in chunks for e in chunk.endpoints]
    raw = [a for chunk in chunks for a in chunk.slice_assignments]
    if generation <= accepted_before:
        return False, f"generation {generation} is not newer than {accepted_before}", endpoints, []
    problems = []
    valid = []
    for assignment in raw:
        start = assignment.slice.start_key
        end = assignment.slice.end_key if assignment.slice.HasField("end_key") else None
        indices = [e.endpoint_index for e in assignment.endpoints]
        if len(start) > MAX_KEY_BYTES or (end is not None and len(end) > MAX_KEY_BYTES):
            problems.append("a key longer than 512 bytes")
        elif end is not None and not start < end:
            problems.append(f"empty slice [{start.hex()}, {end.hex()})")
        elif any(i < 0 or i >= len(endpoints) for i in indices):
            problems.append(f"slice {start.hex()} names an endpoint past {len(endpoints)}")
        else:
            valid.append((start, end, indices))
    valid.sort(key=lambda s: s[0])
    kept = []
    for start, end, indices in valid:
        if kept and (kept[-1][1] is None or kept[-1][1] > start):
            problems.append(f"slice {start.hex()} overlaps the one before")
        else:
            kept.append((start, end, indices))
    if not kept:
        return False, "; ".join(problems + ["no valid slice"])[:MAX_MESSAGE_CHARS], endpoints, []
    filled = []
    gaps = 0
    cursor = b""
    for start, end, indices in kept:
        if start > cursor:
            filled.append((cursor, start, []))
            gaps += 1
        filled.append((start, end, indices))
        cursor = end
    if cursor is not None:
        filled.append((cursor, None, []))
        gaps += 1
    if gaps:
        problems.append(f"gaps filled: {gaps}")
    return True, "; ".join(problems)[:MAX_MESSAGE_CHARS], endpoints, filled


def describe(slices, endpoints):
    return [
        {
            "start": start.hex(),
            "end": None if end is None else end.hex(),
            "endpoints": [endpoints[i] for i in indices],
        }
        for start, end, indices in slices
    ]


class Follower:
    """One client: what it accepted and counted, across its streams."""

    def __init__(self, args, pb2, stub):
        self.args = args
        self.pb2 = pb2
        self.stub = stub
        self.latest = args.latest_generation
        self.loads = {bytes.fromhex(k): float(v) for k, v in json.loads(args.loads).items()}
        self.assignments = 0
        self.reports = 0
        self.rejected_first = False
        self.last_report_end = time.time()
        self.signals = asyncio.Queue()
        self.done = False
        read_commands(self.signals)

    def request(self, **fields):
        return self.pb2.WatchShardingAssignmentRequest(**fields)

    def check_finished(self):
        if not self.done and self.assignments >= self.args.assignments and self.reports >= self.args.reports:
            self.done = True
            self.signals.put_nowait("done")

    async def follow(self, number):
        """One stream: returns "done", "released", "reconnect" or "ended" (the server
        closed it)."""
        call = self.stub.WatchShardingAssignment()
        hello = self.pb2.InitialClientConfig(
            target=self.args.target, client_uuid=self.args.uuid, latest_generation=self.latest
        )
        emit("stream", stream=number, latest_generation=self.latest)
        writes = asyncio.Queue()
        await writes.put(self.request(initial_client_config=hello))
        writer = asyncio.ensure_future(self.write(call, writes))
        reporter = []
        reading = asyncio.ensure_future(self.read(call, number, writes, reporter))
        signal = None
        try:
            outcome = None
            while outcome is None:
                signal = asyncio.ensure_future(self.signals.get())
                await asyncio.wait({reading, signal}, return_when=asyncio.FIRST_COMPLETED)
                # A signal first: taken off the queue, it must not be lost to the stream's end.
                if not signal.done():
                    outcome = reading.result()
                elif signal.result() == "done":
                    emit("done", assignments=self.assignments, reports=self.reports)
                    if not self.args.stay:
                        outcome = "done"
                elif signal.result() == "reconnect":
                    outcome = "reconnect"
                elif signal.result() == "eof" and self.args.stay:
                    outcome = "released"
            await writes.put(None)
            try:
                await asyncio.wait_for(writer, 5)
            except (asyncio.TimeoutError, grpc.aio.AioRpcError):
                pass
            return outcome
        finally:
            for task in [reading, signal, writer, *reporter]:
                if task is None:
                    continue
                task.cancel()
            call.cancel()

    async def write(self, call, writes):
        while True:
            message = await writes.get()
            if message is None:
                await call.done_writing()
                return
            await call.write(message)

    async def report(self, number, writes, quantum, resolution, interval):
        while True:
            await asyncio.sleep(interval)
            end = time.time()
            ranges = load_ranges.aggregate(self.loads, quantum, resolution)
            report = self.pb2.LoadReport()
            report.start_time.FromNanoseconds(int(self.last_report_end * 1e9))
            report.end_time.FromNanoseconds(int(end * 1e9))
            load = report.metric_loads[self.args.metric]
            for start, value in ranges:
                load.range_loads.add(start_key=start, load=value)
            await writes.put(self.request(load_report=report))
            emit(
                "report",
                stream=number,
                start=self.last_report_end,
                end=end,
                metric=self.args.metric,
                ranges=[{"start": s.hex(), "load": v} for s, v in ranges],
            )
            self.last_report_end = end
            self.reports += 1
            self.check_finished()

    async def read(self, call, number, writes, reporter):
        start_latest = self.latest
        configured = False
        chunks = []
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    code = await call.code()
                    emit("status", stream=number, code=code.name, details=await call.details())
                    return "ended"
                kind = field_of(response)
                if kind == "config":
                    config = response.config
                    emit(
                        "config",
                        stream=number,
                        load_quantum_fraction=config.load_quantum_fraction,
                        max_load_balancing_resolution_bytes=config.max_load_balancing_resolution_bytes,
                        load_reporting_interval=seconds(config.load_reporting_interval),
                        load_report_start_threshold=seconds(config.load_report_start_threshold),
                    )
                    for task in reporter:
                        task.cancel()
                    reporter.clear()
                    if self.loads:
                        interval = max(self.args.min_interval, seconds(config.load_reporting_interval))
                        reporter.append(
                            asyncio.ensure_future(
                                self.report(
                                    number,
                                    writes,
                                    config.load_quantum_fraction,
                                    config.max_load_balancing_resolution_bytes,
                                    interval,
                                )
                            )
                        )
                    configured = True
                    continue
                if not configured:
                    emit("violation", stream=number, rule=f"{kind} before LoadReportingConfig")
                if kind == "chunk":
                    if len(chunks) >= MAX_CHUNKS:
                        emit("violation", stream=number, rule=f"over {MAX_CHUNKS} chunks in one assignment")
                        continue
                    chunks.append(response.chunk)
                elif kind == "metadata":
                    generation = response.metadata.generation
                    if generation <= start_latest:
                        emit(
                            "violation",
                            stream=number,
                            rule=f"generation {generation} sent to a client holding {start_latest}",
                        )
                    await self.close_assignment(number, writes, chunks, generation)
                    chunks = []
                    self.check_finished()
                else:
                    emit("violation", stream=number, rule=f"a response with {kind or 'no field'} set")
        except grpc.aio.AioRpcError as error:
            emit("status", stream=number, code=error.code().name, details=error.details())
            return "ended"

    async def close_assignment(self, number, writes, chunks, generation):
        accepted, message, endpoints, slices = reassemble(chunks, generation, self.latest)
        if accepted and self.args.reject_first and not self.rejected_first:
            self.rejected_first = True
            accepted, message = False, "refused on purpose by the interop client"
        if accepted:
            self.latest = generation
        ack = self.pb2.AssignmentAck(generation=generation, accepted=accepted, error_message=message)
        await writes.put(self.request(assignment_ack=ack))
        self.assignments += 1
        emit(
            "assignment",
            stream=number,
            generation=generation,
            chunks=len(chunks),
            accepted=accepted,
            error_message=message,
            endpoints=endpoints,
            slices=describe(slices, endpoints),
        )


async def run(args):
    pb2, pb2_grpc = stubs.load(args.proto)
    async with grpc.aio.insecure_channel(args.server) as channel:
        follower = Follower(args, pb2, pb2_grpc.AutoshardingServiceStub(channel))
        number = 0
        while True:
            number += 1
            outcome = await follower.follow(number)
            if outcome == "released":
                emit("released")
            if outcome != "reconnect":
                break
    emit("exit", latest_generation=follower.latest)


async def bounded(args):
    try:
        await asyncio.wait_for(run(args), args.deadline)
    except asyncio.TimeoutError:
        emit("timeout", deadline=args.deadline)
        sys.exit(3)


if __name__ == "__main__":
    asyncio.run(bounded(parse_args()))
