#!/usr/bin/env python3
"""An autosharding (gRFC A119) server written in Python with grpcio, for steady's client.

It serves one target on 127.0.0.1 (port 0) and, on each stream, runs a fixed
script: the load reporting configuration; an assignment of generation G in several
chunks (the slices spread over the chunks in reverse order, the endpoint list split
across them in order); once that is acknowledged, generation G+1 (every slice moved to
the next endpoint); once that is acknowledged, generation G again, stale, which the
client must refuse. Every stream gets the configuration and only what is newer than the
client's `latest_generation`, and the stale one only after both; a client that refuses
a new one gets nothing more on that stream. Streams stay open for
load reports until the client leaves or the server stops.

It checks the client as it goes: the first message must be `initial_client_config`
(and no later one), every assignment must be acknowledged with its generation, and
every load report must honor the quantum and resolution it was given (load_ranges.py).

Output: one JSON object per line on stdout, the first `{"event": "listening", "port": P}`;
then per stream `stream` (what the client said first), `sent` (each assignment: its
slices, chunk count), `ack`, `report` (ranges, interval, and any `violations`),
`violation` (any other rule broken), `stream_end`; last `stopped`. The server stops by
itself after `--deadline` seconds.
"""

import argparse
import asyncio
import json
import os
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_ranges  # noqa: E402
import stubs  # noqa: E402

KEY_SPACE = 1 << 64


def emit(event, **fields):
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto", required=True, help="autosharding.proto")
    parser.add_argument("--target", required=True, help="the one target served")
    parser.add_argument("--endpoints", required=True, help="endpoint names, comma-separated")
    parser.add_argument("--slices", type=int, default=8, help="slices per assignment")
    parser.add_argument("--chunks", type=int, default=3, help="chunks per assignment")
    parser.add_argument("--generation", type=int, default=10, help="the first generation")
    parser.add_argument("--gap", action="store_true", help="leave the second slice out of G")
    parser.add_argument("--quantum", type=float, default=0.25)
    parser.add_argument("--resolution", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.2, help="load reporting interval (s)")
    parser.add_argument("--threshold", type=float, default=300.0, help="report start threshold (s)")
    parser.add_argument("--ack-timeout", type=float, default=60.0)
    parser.add_argument("--deadline", type=float, default=120.0, help="stop after this long (s)")
    return parser.parse_args()


def field_of(message):
    """The one field set in a message ("exactly one field is set"; the .proto declares
    no oneof), "several: a,b" when more are, None when none is."""
    fields = [f.name for f, _ in message.ListFields()]
    if len(fields) > 1:
        return "several: " + ",".join(fields)
    return fields[0] if fields else None


def key(n):
    return n.to_bytes(8, "big")


def duration(pb_duration, seconds):
    pb_duration.seconds = int(seconds)
    pb_duration.nanos = int(round((seconds - int(seconds)) * 1e9))


class Script:
    """The assignments one target goes through, as (generation, slices) with each slice
    (start, end or None, endpoint indices)."""

    def __init__(self, args):
        self.endpoints = args.endpoints.split(",")
        self.first = self.slices_of(args.generation, args.slices, skip=1 if args.gap else None)
        self.second = self.slices_of(args.generation + 1, args.slices, skip=None)
        self.generation = args.generation

    def slices_of(self, generation, count, skip):
        slices = []
        for i in range(count):
            start = b"" if i == 0 else key(i * KEY_SPACE // count)
            end = None if i == count - 1 else key((i + 1) * KEY_SPACE // count)
            if i != skip:
                slices.append((start, end, [(i + generation) % len(self.endpoints)]))
        return slices

    def describe(self, slices):
        return [
            {
                "start": start.hex(),
                "end": None if end is None else end.hex(),
                "endpoints": [self.endpoints[i] for i in indices],
            }
            for start, end, indices in slices
        ]


class Service:
    def __init__(self, args, pb2):
        self.args = args
        self.pb2 = pb2
        self.script = Script(args)
        self.streams = 0

    def config(self):
        response = self.pb2.WatchShardingAssignmentResponse()
        config = response.config
        config.load_quantum_fraction = self.args.quantum
        config.max_load_balancing_resolution_bytes = self.args.resolution
        duration(config.load_reporting_interval, self.args.interval)
        duration(config.load_report_start_threshold, self.args.threshold)
        return response

    def chunks(self, generation, slices):
        """The assignment as responses: chunks, then its metadata."""
        count = max(1, self.args.chunks)
        endpoints = self.script.endpoints
        per_chunk = -(-len(endpoints) // count)
        responses = [self.pb2.WatchShardingAssignmentResponse() for _ in range(count)]
        # The endpoint list in order, cut into consecutive parts.
        for c, response in enumerate(responses):
            for name in endpoints[c * per_chunk : (c + 1) * per_chunk]:
                response.chunk.endpoints.add(endpoint=name)
        # The slices in reverse order, dealt round-robin: their order carries nothing.
        for n, (start, end, indices) in enumerate(reversed(slices)):
            assignment = responses[n % count].chunk.slice_assignments.add()
            assignment.slice.start_key = start
            if end is not None:
                assignment.slice.end_key = end
            for index in indices:
                assignment.endpoints.add(endpoint_index=index)
        for response in responses:
            response.chunk.SetInParent()  # a chunk with nothing in it is still a chunk
        closing = self.pb2.WatchShardingAssignmentResponse()
        closing.metadata.generation = generation
        return responses + [closing]

    async def WatchShardingAssignment(self, request_iterator, context):
        self.streams += 1
        stream = self.streams
        first = await context.read()
        if first is grpc.aio.EOF:
            emit("stream_end", stream=stream, reason="client sent nothing")
            return
        if field_of(first) != "initial_client_config":
            emit("violation", stream=stream, rule="the first message is not initial_client_config")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "initial_client_config first")
        hello = first.initial_client_config
        emit(
            "stream",
            stream=stream,
            target=hello.target,
            client_uuid=hello.client_uuid,
            latest_generation=hello.latest_generation,
        )
        if hello.target != self.args.target:
            emit("stream_end", stream=stream, status="NOT_FOUND")
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no target {hello.target!r}")

        acks = asyncio.Queue()
        reader = asyncio.ensure_future(self.read(stream, context, acks))
        try:
            await context.write(self.config())
            latest = hello.latest_generation
            plan = [(self.script.generation, self.script.first), (self.script.generation + 1, self.script.second)]
            sent = [g for g, _ in plan if g > latest]
            refused = False
            for generation, slices in plan:
                if generation > latest and not refused:
                    refused = not await self.send(stream, context, acks, generation, slices, expect=True)
            if len(sent) == len(plan) and not refused:
                # Stale on purpose: older than what the client just accepted.
                generation, slices = plan[0]
                await self.send(stream, context, acks, generation, slices, expect=False)
            await reader
        finally:
            reader.cancel()
            emit("stream_end", stream=stream)

    async def send(self, stream, context, acks, generation, slices, expect):
        """Sends one assignment and waits for its ack; returns whether it was accepted."""
        responses = self.chunks(generation, slices)
        for response in responses:
            await context.write(response)
        emit(
            "sent",
            stream=stream,
            generation=generation,
            chunks=len(responses) - 1,
            slices=self.script.describe(slices),
            stale=not expect,
        )
        try:
            ack = await asyncio.wait_for(acks.get(), self.args.ack_timeout)
        except asyncio.TimeoutError:
            emit("violation", stream=stream, rule=f"no ack for generation {generation}")
            return False
        if ack.generation != generation:
            emit("violation", stream=stream, rule=f"ack for {ack.generation}, expected {generation}")
        return ack.accepted

    async def read(self, stream, context, acks):
        while True:
            try:
                request = await context.read()
            except grpc.aio.AioRpcError:
                return
            if request is grpc.aio.EOF:
                return
            kind = field_of(request)
            if kind == "assignment_ack":
                ack = request.assignment_ack
                emit(
                    "ack",
                    stream=stream,
                    generation=ack.generation,
                    accepted=ack.accepted,
                    error_message=ack.error_message,
                )
                await acks.put(ack)
            elif kind == "load_report":
                self.check_report(stream, request.load_report)
            elif kind == "initial_client_config":
                emit("violation", stream=stream, rule="initial_client_config after the first message")
            else:
                emit("violation", stream=stream, rule="a request with no field set")

    def check_report(self, stream, report):
        now = time.time()
        start = report.start_time.seconds + report.start_time.nanos / 1e9
        end = report.end_time.seconds + report.end_time.nanos / 1e9
        violations = []
        if not report.HasField("start_time") or not report.HasField("end_time"):
            violations.append("a report without start or end time")
        elif not start < end:
            violations.append(f"report ends ({end}) before it starts ({start})")
        elif start < now - self.args.threshold - 30:
            violations.append(f"report starts {now - start:.1f} s back, past the threshold")
        elif end > now + 30:
            violations.append(f"report ends {end - now:.1f} s in the future")
        metrics = {}
        for metric, load in report.metric_loads.items():
            ranges = [(r.start_key, r.load) for r in load.range_loads]
            violations += [f"{metric}: {v}" for v in load_ranges.violations(ranges, self.args.quantum, self.args.resolution)]
            metrics[metric] = [{"start": s.hex(), "load": l} for s, l in ranges]
        emit("report", stream=stream, start=start, end=end, metrics=metrics, violations=violations)


async def serve(args):
    pb2, pb2_grpc = stubs.load(args.proto)
    server = grpc.aio.server()
    pb2_grpc.add_AutoshardingServiceServicer_to_server(Service(args, pb2), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    emit("listening", port=port)
    await server.wait_for_termination(timeout=args.deadline)
    await server.stop(grace=None)
    emit("stopped", reason="deadline")


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))
